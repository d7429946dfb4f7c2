"""The static placement policy: fixed fractions of chunks live off the compute tier.

This is the DeepSpeed ZeRO-Offload / Colossal-AI static style: a chosen fraction of the parameter
chunks (and, separately, of the optimizer-state chunks) is *offloaded*: it lives on the host, is
brought to the compute tier for each use and sent back right after. The rest stays resident. It
needs no trace, and moves the same bytes every iteration whatever the budget leaves free.
"""

from __future__ import annotations

from collections.abc import Sequence

from colossal_contracts import ChunkInfo, ConfigError

from ._base import LruPolicy, PolicyContext, _take

__all__ = ["StaticPolicy"]

PARAM_KINDS = frozenset({"param", "grad"})
"""Chunk kinds counted as parameters (gradients share their chunk's layout and placement)."""


class StaticPolicy(LruPolicy):
    """Keep ``offload_param_frac`` of parameter chunks and ``offload_optim_frac`` of optimizer-state
    chunks off the compute tier (the last ones by id); evict those first, least recently used first.

    Attributes:
        name: "static".
        offload_param_frac: fraction of "param"/"grad" chunks streamed from the host per use.
        offload_optim_frac: fraction of the other (optimizer-state) chunks streamed per use.
    """

    name = "static"

    def __init__(self, offload_param_frac: float = 0.0, offload_optim_frac: float = 0.0):
        super().__init__()
        for label, frac in (
            ("offload_param_frac", offload_param_frac),
            ("offload_optim_frac", offload_optim_frac),
        ):
            if not 0.0 <= frac <= 1.0:
                raise ConfigError(f"{label} must be within [0, 1], got {frac}")
        self.offload_param_frac = offload_param_frac
        self.offload_optim_frac = offload_optim_frac
        self._offloaded: set[int] = set()

    @classmethod
    def fitting(cls, context: PolicyContext, working_bytes: int) -> StaticPolicy:
        """The policy that offloads the smallest equal fraction of every kind such that the resident
        chunks plus a working set of ``working_bytes`` fit in ``context.capacity_bytes``."""
        room = max(0, context.capacity_bytes - working_bytes)
        lo, hi = 0.0, 1.0
        if _resident_bytes(context, 0.0) <= room:
            return cls(0.0, 0.0)
        for _ in range(40):  # bisection on the shared fraction
            mid = (lo + hi) / 2
            if _resident_bytes(context, mid) <= room:
                hi = mid
            else:
                lo = mid
        return cls(hi, hi)

    @property
    def offloaded(self) -> frozenset[int]:
        return frozenset(self._offloaded)

    def bind(self, context: PolicyContext) -> None:
        self._offloaded = _offloaded_ids(context, self.offload_param_frac, self.offload_optim_frac)

    def evict_after_use(self, chunk_id: int) -> bool:
        return chunk_id in self._offloaded

    def choose_evictions(
        self, candidates: Sequence[ChunkInfo], needed_bytes: int, *, moment: int
    ) -> list[int]:
        ordered = self._lru_order(candidates)
        first = [c for c in ordered if c.chunk_id in self._offloaded]
        rest = [c for c in ordered if c.chunk_id not in self._offloaded]
        return _take(first + rest, needed_bytes)


def _offloaded_ids(context: PolicyContext, param_frac: float, optim_frac: float) -> set[int]:
    out: set[int] = set()
    for is_param, frac in ((True, param_frac), (False, optim_frac)):
        ids = [c.chunk_id for c in context.chunks if (c.kind in PARAM_KINDS) == is_param]
        n_off = round(frac * len(ids))
        out.update(ids[len(ids) - n_off :] if n_off else [])
    return out


def _resident_bytes(context: PolicyContext, frac: float) -> int:
    off = _offloaded_ids(context, frac, frac)
    return sum(c.num_bytes for c in context.chunks if c.chunk_id not in off)
