"""Offline replay of chunk accesses: Belady's MIN as the yardstick, and any policy on the same trace.

[Note: simulated model] A trace is a sequence of steps; each step names the chunks one moment
needs on the compute tier at once. A chunk not resident is loaded (its bytes count as moved in);
making room evicts resident chunks not needed by the step (their bytes count as moved out). The
tier never holds more than ``capacity`` bytes. This is exactly what ``ChunkManager`` does with one
rank, so a policy's simulated bytes equal what the manager moves on the same trace.

[Note: clean evictions] With ``written`` (the chunks each step writes), a replay models a home
tier that keeps its copy of a loaded chunk: evicting a chunk no step wrote since its load drops it
and moves no bytes (it still counts as an eviction). Without it every eviction copies the chunk
out, which is what ``ChunkManager`` does (a move frees the source), so only the default matches the
manager; ``written`` measures what keeping home copies would save.

[Note: optimality] ``simulate`` evicts the resident chunk whose next use is furthest (Belady's MIN).
With chunks of equal size (fixed-size chunks of one dtype) that minimises loads and thus bytes
moved; with unequal sizes it is the classic furthest-next-use rule, a yardstick rather than a proof.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from colossal_contracts import CapacityError, ConfigError, InternalError, PlacementPolicy

from ._base import ChunkSummary, PolicyContext, SimpleChunkInfo

__all__ = ["SimResult", "simulate", "simulate_policy"]

Step = int | Sequence[int]


@dataclass(frozen=True)
class SimResult:
    """Bytes a replay moved.

    Attributes:
        bytes_in: bytes loaded onto the compute tier.
        bytes_out: bytes evicted from it.
        loads: number of chunk loads.
        evictions: number of chunk evictions.
        peak_bytes: most bytes resident at once (never above the capacity).
        per_iteration: bytes moved (in + out) in each repetition of the trace.
        prefetched_loads: loads issued ahead of the step that needs them.
    """

    bytes_in: int
    bytes_out: int
    loads: int
    evictions: int
    peak_bytes: int
    per_iteration: tuple[int, ...]
    prefetched_loads: int = 0

    @property
    def bytes_moved(self) -> int:
        return self.bytes_in + self.bytes_out


def _steps(accesses: Sequence[Step]) -> list[tuple[int, ...]]:
    return [(a,) if isinstance(a, int) else tuple(dict.fromkeys(a)) for a in accesses]


def _size_of(sizes: Mapping[int, int] | Sequence[int]) -> Mapping[int, int]:
    return sizes if isinstance(sizes, Mapping) else dict(enumerate(sizes))


class _Tally:
    def __init__(
        self,
        n_iter: int,
        capacity: int,
        size: Mapping[int, int],
        written: Sequence[Step] | None = None,
    ):
        self.size, self.capacity = size, capacity
        self.written = None if written is None else _steps(written)  # [Note: clean evictions]
        self.dirty: set[int] = set()
        self.resident: dict[int, None] = {}
        self.used = self.peak = 0
        self.b_in = self.b_out = self.loads = self.evictions = 0
        self.per_iter = [0] * n_iter
        self.it = 0
        self.prefetched = 0

    def load(self, cid: int) -> None:
        self.resident[cid] = None
        self.used += self.size[cid]
        if self.used > self.capacity:  # the simulators never let this happen
            raise InternalError("simulated tier went over capacity; this is a bug")
        self.peak = max(self.peak, self.used)
        self.b_in += self.size[cid]
        self.loads += 1
        self.per_iter[self.it] += self.size[cid]

    def wrote(self, step_in_iteration: int, step: tuple[int, ...]) -> None:
        """The step ran: its chunks are changed (all of them unless ``written`` says which)."""
        self.dirty.update(step if self.written is None else self.written[step_in_iteration])

    def evict(self, cid: int) -> None:
        del self.resident[cid]
        self.used -= self.size[cid]
        self.evictions += 1
        if cid in self.dirty or self.written is None:
            self.dirty.discard(cid)
            self.b_out += self.size[cid]
            self.per_iter[self.it] += self.size[cid]

    def result(self) -> SimResult:
        return SimResult(
            self.b_in,
            self.b_out,
            self.loads,
            self.evictions,
            self.peak,
            tuple(self.per_iter),
            self.prefetched,
        )


def _too_big(step: tuple[int, ...], size: Mapping[int, int], capacity: int, t: int) -> None:
    need = sum(size[c] for c in step)
    if need > capacity:
        raise CapacityError(
            f"step {t} needs chunks {list(step)} ({need:,} bytes) at once but the capacity is "
            f"{capacity:,} bytes; raise the capacity or use smaller chunks"
        )


def simulate(
    accesses: Sequence[Step],
    sizes: Mapping[int, int] | Sequence[int],
    capacity: int | Sequence[int],
    *,
    iterations: int = 1,
    written: Sequence[Step] | None = None,
) -> SimResult:
    """Belady's MIN over ``accesses`` repeated ``iterations`` times, starting cold ([Note:
    optimality]). ``sizes`` gives each chunk id's bytes. ``capacity`` is one figure, or one per
    step of an iteration (what model data may use while that step runs). ``written``: the
    chunks each step of an iteration writes ([Note: clean evictions]; default: all it uses)."""
    size = _size_of(sizes)
    _check_written(written, accesses)
    steps = _steps(accesses) * iterations
    caps = [capacity] * len(accesses) if isinstance(capacity, int) else list(capacity)
    if len(caps) != len(accesses):
        raise ConfigError(
            f"capacity has {len(caps)} entries for {len(accesses)} steps; give one each"
        )
    caps = caps * iterations
    n = max(1, len(accesses))
    nxt: list[dict[int, float]] = [{} for _ in steps]  # per step: next use of its chunks after it
    later: dict[int, float] = {}
    for t in range(len(steps) - 1, -1, -1):
        for c in steps[t]:
            nxt[t][c] = later.get(c, math.inf)
        for c in steps[t]:
            later[c] = t
    next_use: dict[int, float] = {}  # resident chunk -> next step that needs it
    tally = _Tally(iterations, max(caps, default=0), size, written)
    for t, step in enumerate(steps):
        tally.it = t // n
        cap = caps[t]
        _too_big(step, size, cap, t)
        need = sum(size[c] for c in step if c not in tally.resident)
        if tally.used + need > cap:
            victims = sorted(
                (c for c in tally.resident if c not in step), key=lambda c: (-next_use[c], c)
            )
            for c in victims:
                if tally.used + need <= cap:
                    break
                tally.evict(c)
        for c in step:
            if c not in tally.resident:
                tally.load(c)
            next_use[c] = nxt[t][c]
        tally.wrote(t % n, step)
    return tally.result()


def _check_written(written: Sequence[Step] | None, accesses: Sequence[Step]) -> None:
    if written is None:
        return
    if len(written) != len(accesses):
        raise ConfigError(
            f"written has {len(written)} entries for {len(accesses)} steps; give one each"
        )
    for t, (w, a) in enumerate(zip(_steps(written), _steps(accesses))):
        if not set(w) <= set(a):
            raise ConfigError(
                f"step {t} writes chunks {sorted(set(w) - set(a))} it does not use; a step "
                "can write only the chunks it needs"
            )


def simulate_policy(
    policy: PlacementPolicy,
    accesses: Sequence[Step],
    sizes: Mapping[int, int] | Sequence[int],
    capacity: int,
    *,
    iterations: int = 1,
    prefetch: int = 0,
    context: PolicyContext | None = None,
    written: Sequence[Step] | None = None,
) -> SimResult:
    """Replay ``accesses`` with ``policy`` deciding evictions, as ``ChunkManager`` would
    ([Note: simulated model]), including its optional hooks ([Note: policy hooks]).
    ``written``: as for ``simulate`` ([Note: clean evictions]).

    ``prefetch`` > 0 loads the chunks of the next moments after each step when they fit without
    evicting a chunk needed sooner. ``context`` is passed to ``policy.bind`` (default: every chunk
    is a "param" chunk).
    """
    size = _size_of(sizes)
    steps = _steps(accesses)
    n = max(1, len(steps))
    policy.bind(
        context
        or PolicyContext(
            tuple(ChunkSummary(c, "param", b) for c, b in sorted(size.items())), {}, capacity
        )
    )
    _check_written(written, accesses)
    tally = _Tally(iterations, capacity, size, written)

    def limit(m: int) -> int:
        return min(capacity, policy.model_budget(capacity, m))

    def make_room(need: int, keep: tuple[int, ...], m: int, t: int) -> None:
        short = tally.used + need - limit(m)
        if short <= 0:
            return
        cands = [SimpleChunkInfo(c, size[c]) for c in tally.resident if c not in keep]
        chosen = policy.choose_evictions(cands, short, moment=m)
        rest = [c.chunk_id for c in cands if c.chunk_id not in chosen]
        for c in [
            *chosen,
            *rest,
        ]:  # as the manager: the rest in order if the policy chose too little
            tally.evict(c)
            short -= size[c]
            if short <= 0:
                return
        raise CapacityError(
            f"step {t} needs {need:,} bytes but the model-data budget {limit(m):,} (capacity "
            f"{capacity:,}) cannot be freed for it; raise the capacity or use smaller chunks"
        )

    for it in range(iterations):
        tally.it = it
        for m, step in enumerate(steps):
            t = it * n + m
            policy.on_moment(m)
            _too_big(step, size, capacity, t)
            make_room(sum(size[c] for c in step if c not in tally.resident), step, m, t)
            for c in step:
                if c not in tally.resident:
                    tally.load(c)
            policy.on_access(list(step), m)
            tally.wrote(m, step)
            for c in step:
                if policy.evict_after_use(c):
                    tally.evict(c)
            if prefetch:
                _prefetch(tally, policy, m, prefetch, limit(m))
    return tally.result()


def _prefetch(tally: _Tally, policy: PlacementPolicy, m: int, horizon: int, limit: int) -> None:
    next_use = policy.next_use
    for c in policy.upcoming(m, horizon):
        if c in tally.resident:
            continue
        target = next_use(c, m)
        short = tally.used + tally.size[c] - limit
        if short > 0:
            later = sorted(
                (r for r in tally.resident if next_use(r, m) > target),
                key=lambda r: -next_use(r, m),
            )
            if sum(tally.size[r] for r in later) < short:
                continue
            for r in later:
                if short <= 0:
                    break
                tally.evict(r)
                short -= tally.size[r]
        tally.load(c)
        tally.prefetched += 1
