"""A tensor's record in its chunk, with its state kept as a small number.

[Note: states by number] ``TensorState`` is an ``Enum``, whose hash is a Python-level function: a
chunk that kept its per-state counters in a dict keyed by state, and checked each transition
against ``LEGAL_TRANSITIONS`` (a dict of frozensets), hashed a state four times per transition
and once per counter read: about 2,900 times in a quarter-budget step of GPT tiny on one rank
(367 transitions). So each state has a code, its position in ``STATES``; a record keeps the
code (``TensorRecord.state`` reads and writes the enum through it), a chunk's counters are a list
indexed by code, and ``LEGAL[old][new]`` is ``LEGAL_TRANSITIONS`` as a table of booleans (staying
in a state is legal): the chunk hashes no state. An illegal transition still goes through
``check_transition``, which raises the same ``StateTransitionError``.
"""

from __future__ import annotations

import torch

from colossal_contracts import LEGAL_TRANSITIONS, TensorState

__all__ = ["COMPUTE", "FREE", "HOLD", "LEGAL", "READY", "STATES", "TensorRecord", "code_of"]

STATES: tuple[TensorState, ...] = tuple(TensorState)  # code -> state
FREE, COMPUTE, HOLD, READY = (
    STATES.index(s)
    for s in (TensorState.FREE, TensorState.COMPUTE, TensorState.HOLD, TensorState.READY_FOR_REDUCE)
)
LEGAL: tuple[tuple[bool, ...], ...] = tuple(
    tuple(old is new or new in LEGAL_TRANSITIONS[old] for new in STATES) for old in STATES
)
# Members of an Enum live as long as their class: their ids are stable keys, hashed in C.
_CODE = {id(s): i for i, s in enumerate(STATES)}


def code_of(state: TensorState) -> int:
    """The code of ``state`` ([Note: states by number])."""
    code = _CODE.get(id(state))
    if code is None:
        raise TypeError(f"expected a TensorState, got {state!r}")
    return code


class TensorRecord:
    """Where one tensor sits in its chunk, and its state.

    Attributes:
        name: the tensor's name (for parameters, as in ``model.named_parameters()``).
        offset: first element in the full chunk.
        numel: number of elements.
        shape: the tensor's shape.
        state: its current ``TensorState`` (kept as ``code``, [Note: states by number]).
    """

    __slots__ = ("code", "name", "numel", "offset", "shape")

    def __init__(
        self, name: str, offset: int, numel: int, shape: torch.Size, state: TensorState
    ) -> None:
        self.name, self.offset, self.numel, self.shape = name, offset, numel, shape
        self.code = code_of(state)

    @property
    def state(self) -> TensorState:
        return STATES[self.code]

    @state.setter
    def state(self, state: TensorState) -> None:
        self.code = code_of(state)

    @property
    def end(self) -> int:
        return self.offset + self.numel

    def __repr__(self) -> str:
        return (
            f"TensorRecord(name={self.name!r}, offset={self.offset}, numel={self.numel}, "
            f"shape={tuple(self.shape)}, state={self.state.name})"
        )
