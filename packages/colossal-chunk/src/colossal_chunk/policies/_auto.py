"""The automatic placement policy: budget from the trace, Belady eviction from the compute order.

[Note: auto budget] After warmup, model data may use the compute tier's capacity minus the highest
non-model peak (activations, temporaries) that the trace saw over the current moment and the next
``lookahead`` moments, raised by the safety ``margin`` (a fraction). The room therefore changes
moment by moment (Gemini's central idea); the manager shrinks to it when a moment begins. During
warmup nothing is known, so model data gets a fixed share.

[Note: Belady eviction] When room is short, evict the chunk whose next use, in the compute order
the warmup traced, is furthest away (a chunk never used again counts as furthest). Uses wrap
around: after the last moment of a step comes the first moment of the next step.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence

from colossal_contracts import ChunkInfo, ConfigError, MemStatsSource, TierName

from ._base import LruPolicy, PolicyContext, _take

__all__ = ["AutoPolicy"]


class AutoPolicy(LruPolicy):
    """Trace-driven placement (Colossal-AI's "auto"): see [Note: auto budget], [Note: Belady eviction].

    Attributes:
        name: "auto".
        stats: what the warmup traced; None until ``update`` is called (warmup mode: LRU eviction
            and ``warmup_share`` of the capacity for model data).
        warmup_share: share of the compute tier model data may use while no trace is known.
        lookahead: moments after the current one whose non-model peaks are reserved too.
        margin: safety margin on the traced non-model peaks (0.1: reserve 110% of them).
        warmup_loan: while no trace is known, an access that finds no room borrows beyond the
            compute tier's capacity instead of failing ([Note: warmup loan] in ``_room.py``);
            for a caller that sizes chunks from the trace right after the warmup.
    """

    name = "auto"

    def __init__(
        self,
        stats: MemStatsSource | None = None,
        *,
        warmup_share: float = 0.8,
        lookahead: int = 1,
        margin: float = 0.0,
        tier: TierName = TierName.ACCELERATOR,
        warmup_loan: bool = False,
    ):
        super().__init__()
        if not 0.0 < warmup_share <= 1.0:
            raise ConfigError(f"warmup_share must be within (0, 1], got {warmup_share}")
        if lookahead < 0:
            raise ConfigError(f"lookahead must be >= 0, got {lookahead}")
        if margin < 0:
            raise ConfigError(
                f"margin must be >= 0 (a fraction of the non-model peak), got {margin}"
            )
        self.margin = margin
        self.stats = stats
        self.warmup_share = warmup_share
        self.lookahead = lookahead
        self.tier = tier
        self.warmup_loan = warmup_loan
        self._chunk_of: Mapping[str, int] = {}
        self._schedule: list[tuple[int, ...]] | None = None  # chunk ids per moment
        self._uses: dict[int, list[int]] = {}  # chunk id -> sorted moments that use it
        self._budgets: dict[tuple[int, int], int] = {}  # (capacity, moment) -> model budget
        self._rebuild()

    # ----- what the policy knows ----------------------------------------------------------------
    def bind(self, context: PolicyContext) -> None:
        self._chunk_of = dict(context.chunk_of)
        self._rebuild()

    def update(self, stats: MemStatsSource) -> None:
        """Adopt a (new) trace; from now on eviction is Belady and the budget follows the trace."""
        self.stats = stats
        self._rebuild()

    def set_schedule(self, schedule: Sequence[Sequence[int]]) -> None:
        """Give the chunk ids each moment uses directly (instead of names through ``stats``)."""
        self._set_schedule([tuple(dict.fromkeys(m)) for m in schedule])

    @property
    def warm(self) -> bool:
        """True once a compute order is known."""
        return self._schedule is not None

    def _rebuild(self) -> None:
        self._budgets.clear()  # the trace (or the chunks) changed: budgets are computed again
        if self.stats is None or not self._chunk_of or self.stats.num_moments() == 0:
            return
        sched = []
        for names in self.stats.compute_order():
            ids = (self._chunk_of[n] for n in names if n in self._chunk_of)
            sched.append(tuple(dict.fromkeys(ids)))
        self._set_schedule(sched)

    def _set_schedule(self, sched: list[tuple[int, ...]]) -> None:
        self._schedule = sched or None
        self._uses = {}
        for m, ids in enumerate(sched):
            for cid in ids:
                self._uses.setdefault(cid, []).append(m)

    # ----- hooks --------------------------------------------------------------------------------
    def next_use(self, chunk_id: int, moment: int) -> float:
        """The first moment after ``moment`` that uses ``chunk_id`` (wrapping into the next step)."""
        uses = self._uses.get(chunk_id)
        if not uses or self._schedule is None:
            return math.inf
        n = len(self._schedule)
        base, m = divmod(moment, n)
        i = bisect.bisect_right(uses, m)
        if i < len(uses):
            return base * n + uses[i]
        return (base + 1) * n + uses[0]

    def upcoming(self, moment: int, horizon: int) -> list[int]:
        """Chunks the next ``horizon`` moments use, soonest first."""
        if self._schedule is None:
            return []
        n = len(self._schedule)
        out: dict[int, None] = {}
        for k in range(1, horizon + 1):
            out.update(dict.fromkeys(self._schedule[(moment + k) % n]))
        return list(out)

    def model_budget(self, capacity: int, moment: int) -> int:
        """See [Note: auto budget]. Computed once per moment of a trace (an access asks often)."""
        if self._schedule is None:
            return int(capacity * self.warmup_share)
        if self.stats is None or self.stats.num_moments() == 0:
            return capacity  # a schedule given directly, without non-model figures
        n = self.stats.num_moments()
        key = (capacity, moment % n)
        budget = self._budgets.get(key)
        if budget is None:
            budget = self._budgets[key] = max(0, capacity - self.non_model_reserve(moment))
        return budget

    def non_model_reserve(self, moment: int) -> int:
        """Bytes [Note: auto budget] keeps free for non-model data at ``moment``: the highest
        traced peak over it and the next ``lookahead`` moments, raised by ``margin``. Not clipped
        to any capacity (a budget named from it must hold it whole); 0 while nothing is traced."""
        if self.stats is None or self.stats.num_moments() == 0:
            return 0
        n = self.stats.num_moments()
        peak = max(
            self.stats.non_model_peak((moment + k) % n, self.tier)
            for k in range(self.lookahead + 1)
        )
        return math.ceil(peak * (1.0 + self.margin))

    def non_model_peak(self, moment: int) -> int:
        """The traced non-model peak of ``moment`` itself: no margin, no lookahead (0 untraced).
        What no placement can do without at that moment."""
        if self.stats is None or self.stats.num_moments() == 0:
            return 0
        return self.stats.non_model_peak(moment % self.stats.num_moments(), self.tier)

    def max_non_model_reserve(self) -> int:
        """The largest ``non_model_reserve`` over the traced step's moments (0 untraced)."""
        n = 0 if self.stats is None else self.stats.num_moments()
        return max((self.non_model_reserve(m) for m in range(n)), default=0)

    def choose_evictions(
        self, candidates: Sequence[ChunkInfo], needed_bytes: int, *, moment: int
    ) -> list[int]:
        if self._schedule is None:
            return super().choose_evictions(candidates, needed_bytes, moment=moment)
        lru = {c.chunk_id: i for i, c in enumerate(self._lru_order(candidates))}
        ordered = sorted(
            candidates,
            key=lambda c: (-self.next_use(c.chunk_id, moment), lru[c.chunk_id]),
        )
        return _take(ordered, needed_bytes)
