"""The chunk manager's books: per-moment demand on the compute tier (what state placement plans
with), kept chunks, copies made outside the manager, per-tier bytes and peaks, and the payload
tensors a memory tracer counts as model data.

The manager owns one ``Books`` (``ChunkManager.books``), composed rather than inherited: what a
memory tracer, a plugin or an owner such as Gemini reads of the accounting is read here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from colossal_contracts import StateTransitionError, TierName

from ._accounting import ManagerStats, TierStats
from ._chunk import Chunk
from ._placement import Placement
from ._tier import Tier

__all__ = ["Books"]

ACC = TierName.ACCELERATOR


class Books:
    """What the manager counts and records; see the module docstring."""

    _demand: dict[int, list[int]] | None  # moment -> [unfreeable, resident]; None: not tracking

    def __init__(
        self,
        placement: Placement,
        chunks: Callable[[], dict[int, Chunk]],
        moment: Callable[[], int],
        *,
        changed: Callable[[], None] = lambda: None,
    ) -> None:
        """``chunks`` gives the manager's chunks by id now (a re-pack replaces them), ``moment``
        the moment its step is at; ``changed`` is called when what the step's fast path
        checked changes (``track_demand``)."""
        self._placement, self._chunks, self._moment = placement, chunks, moment
        self._changed = changed
        self._demand = None

    @property
    def tracking(self) -> bool:
        """True while ``track_demand`` records."""
        return self._demand is not None

    @property
    def tiers(self) -> dict[TierName, Tier]:
        return self._placement.tiers

    def note_demand(self) -> None:
        """Record this moment's demand (an access), when tracking."""
        demand = self._demand
        if demand is None:  # not tracking
            return
        row = demand.setdefault(self._moment(), [0, 0])
        row[0] = max(row[0], self._placement.room.demand_bytes(self._chunks().values()))
        row[1] = max(row[1], self.tiers[ACC].used_bytes)

    def track_demand(self, on: bool = True) -> None:
        """From now on record (afresh), per moment, the most compute-tier bytes that no eviction
        could free (chunks in use or awaiting reduction, kept chunks) and the most held there
        at all; read them from ``demand``. ``on=False`` stops recording and forgets them. The
        step's fast path checks its room again (colossal-chunk's [Note: resident fast path])."""
        self._demand = {} if on else None
        self._changed()

    @property
    def demand(self) -> dict[int, tuple[int, int]]:
        """Moment -> (bytes no eviction could free, bytes resident) that ``track_demand``
        recorded at its accesses (empty when not tracking)."""
        return {m: (a, b) for m, (a, b) in (self._demand or {}).items()}

    def keep_on_compute(self, chunks: Iterable[Chunk | int], *, keep: bool = True) -> None:
        """Keep ``chunks`` on the compute tier, never evicted nor displaced by a prefetch (they
        must be there already); ``keep=False`` lets them go. See [Note: kept chunks]."""
        for c in chunks:
            chunk = self._chunks()[c.chunk_id if isinstance(c, Chunk) else c]
            if keep and chunk.tier is not ACC:
                raise StateTransitionError(
                    f"chunk {chunk.chunk_id} is on {chunk.tier}; move it to the compute tier "
                    "before keeping it there"
                )
            chunk.kept = keep

    def kept_bytes(self) -> int:
        """Shard bytes of the chunks kept on the compute tier ([Note: kept chunks])."""
        return sum(c.shard_bytes for c in self._chunks().values() if c.kept)

    def count_copy(self, src: TierName | str, dst: TierName | str, nbytes: int) -> None:
        """Count ``nbytes`` copied from tier ``src`` to ``dst`` outside the manager (a staging
        copy of an optimizer step), so that ``stats`` shows every byte that crossed tiers."""
        self._placement.moves.count_copy(TierName(src), TierName(dst), nbytes)

    def stats(self) -> ManagerStats:
        """Per-tier bytes in use and peak, bytes/count of moves per direction (a prefetch is
        counted when issued; until it completes both its source and destination hold bytes), and
        the disk tier's I/O: read ahead and written behind, and faulted in on use."""
        tiers = {
            n.value: TierStats(n.value, t.capacity_bytes, t.used_bytes, t.peak_bytes, t.emulated)
            for n, t in self.tiers.items()
        }
        padding = sum(c.padding * c.element_size for c in self._chunks().values())
        disk = self.tiers.get(TierName.DISK)
        return ManagerStats(
            tiers,
            self._placement.moves.stats(),
            len(self._chunks()),
            padding,
            self._placement.disk.disk_io(),
            None if disk is None else disk.faulted_bytes,
            self._placement.disk_copies.reused_bytes,  # [Note: disk copies]
            self._placement.host_copies.reused_bytes,  # [Note: host copies]
            self._placement.frozen_written,  # [Note: frozen chunks]
        )

    def model_data_bytes(self, tier: TierName | str) -> int:
        """Chunk payload bytes on ``tier`` now (what a memory tracer counts as model data: not
        the host bytes reserved for the read-ahead window, which hold no payload; the spare
        payloads kept for the next move ([Note: spare payloads]) count on the host tier, or on
        the compute tier when there is no host tier)."""
        name = TierName(tier)
        t = self.tiers.get(name)
        if t is None:
            return 0
        pl = self._placement
        if name is TierName.HOST:
            return t.used_bytes - pl.read_ahead_window.reserved_bytes + pl.spares.nbytes
        if name is TierName.ACCELERATOR and TierName.HOST not in self.tiers:
            return t.used_bytes + pl.spares.nbytes
        return t.used_bytes

    def payload_bytes(self) -> dict[str, int]:
        """This rank's shard bytes (padding included) by chunk kind, frozen parameter chunks
        under "frozen" ([Note: frozen chunks]): what chunk memory holds, wherever it lives."""
        out: dict[str, int] = {}
        for c in self._chunks().values():
            kind = "frozen" if c.frozen else c.kind
            out[kind] = out.get(kind, 0) + c.shard_bytes
        return out

    def reset_peaks(self) -> None:
        """Start new peak windows on every tier (say, at the start of an iteration)."""
        for t in self.tiers.values():
            t.reset_peak()

    def model_tensors(self) -> list[torch.Tensor]:
        """Every chunk payload (shards, and gathered buffers where they are separate), and the spare
        payloads ([Note: spare payloads])."""
        out = []
        for c in self._chunks().values():
            if c.shard is not None:
                out.append(c.shard)
            if c.full is not None and c.full is not c.shard:
                out.append(c.full)
        out.extend(self._placement.spares.tensors())
        out.extend(self._placement.host_copies.tensors())
        return out

    def reset_stats(self) -> None:
        """Zero the move counters and start new peak windows (say, at the start of an iteration)."""
        self._placement.moves.clear()
        for t in self.tiers.values():
            t.reset_peak()
