"""The runtime's state: one training-state enum with its legal transitions (the per-chunk
record, with its gradients' phase, is colossal-chunk's ``ChunkGroup``).

[Note: training state] ``TrainingState`` says where the step is; every hook of the runtime
checks it and every change goes through ``TrainingState.to``, against ``_NEXT``. What holds
memory in each state is in the member comments.
"""

from __future__ import annotations

from enum import Enum

from colossal_contracts import StateTransitionError

__all__ = ["TrainingState"]


class TrainingState(Enum):
    IDLE = "idle"
    """Between steps: chunks hold parameters (and, before the optimizer step, reduced gradients)."""
    FORWARD = "forward"
    """The wrapped module runs: operators access their parameters' chunks (COMPUTE) and release
    them after; saved activations accumulate."""
    PRE_BACKWARD = "pre_backward"
    """Forward returned; outputs carry the hooks that re-access parameters in backward."""
    BACKWARD = "backward"
    """Gradients arrive: parameters are re-accessed, gradients copied into chunk memory, full
    chunks reduce-scattered."""
    POST_BACKWARD = "post_backward"
    """Autograd finished: what is still in COMPUTE is released, partly filled chunks reduced."""

    def to(self, new: TrainingState) -> TrainingState:
        """``new`` if ``self -> new`` is legal, else ``StateTransitionError``."""
        if new in _NEXT[self]:
            return new
        raise StateTransitionError(
            f"Gemini runtime: illegal step transition {self.name} -> {new.name}; from "
            f"{self.name} only {', '.join(s.name for s in _NEXT[self])} may follow"
        )


_T = TrainingState
_NEXT: dict[TrainingState, frozenset[TrainingState]] = {
    _T.IDLE: frozenset({_T.FORWARD}),
    # a forward whose output got no backward (evaluation, no_grad) may be followed by another
    _T.FORWARD: frozenset({_T.PRE_BACKWARD}),
    _T.PRE_BACKWARD: frozenset({_T.FORWARD, _T.BACKWARD}),
    # a backward that raised never reaches POST_BACKWARD: the next forward starts over
    _T.BACKWARD: frozenset({_T.POST_BACKWARD, _T.FORWARD}),
    _T.POST_BACKWARD: frozenset({_T.IDLE}),
}
