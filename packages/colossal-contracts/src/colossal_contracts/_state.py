"""The life cycle of a tensor that lives inside a chunk.

[Note: tensor states] A chunk may leave the compute tier, or release its gathered storage, only
when none of its tensors is in COMPUTE. Gradients are reduced only once every tensor of a chunk
is READY_FOR_REDUCE. The table below is the single place where legal transitions are written.
(Colossal-AI's HOLD_AFTER_BWD is not needed: Gemini collects a gradient into chunk memory as
soon as autograd finishes it, so a tensor goes from COMPUTE straight to READY_FOR_REDUCE.)
"""

from __future__ import annotations

from enum import Enum

from ._errors import StateTransitionError

__all__ = ["LEGAL_TRANSITIONS", "TensorState", "check_transition"]


class TensorState(Enum):
    FREE = "free"
    """No payload: the storage is released (a shard not gathered, or never filled)."""
    COMPUTE = "compute"
    """In use by an operator: the payload must be on the compute tier and may not move."""
    HOLD = "hold"
    """Payload valid and idle: may be moved between tiers or released to its shard."""
    READY_FOR_REDUCE = "ready_for_reduce"
    """Gradient complete: the chunk may reduce(-scatter) it across data-parallel ranks."""


_S = TensorState
LEGAL_TRANSITIONS: dict[TensorState, frozenset[TensorState]] = {
    _S.FREE: frozenset({_S.HOLD}),
    _S.HOLD: frozenset({_S.COMPUTE, _S.FREE}),
    _S.COMPUTE: frozenset({_S.HOLD, _S.READY_FOR_REDUCE}),
    _S.READY_FOR_REDUCE: frozenset({_S.HOLD}),
}
"""Allowed moves; staying in the same state is always allowed and is not listed."""


def check_transition(old: TensorState, new: TensorState, *, what: str = "tensor") -> None:
    """Raise ``StateTransitionError`` unless ``old -> new`` is in ``LEGAL_TRANSITIONS``."""
    if old is new or new in LEGAL_TRANSITIONS[old]:
        return
    allowed = ", ".join(sorted(s.name for s in LEGAL_TRANSITIONS[old]))
    raise StateTransitionError(
        f"{what}: illegal state transition {old.name} -> {new.name}; "
        f"from {old.name} only {allowed} are allowed"
    )
