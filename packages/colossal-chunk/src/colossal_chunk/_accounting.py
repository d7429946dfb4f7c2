"""A manager's accounting: the move counters, and read-only snapshots of per-tier bytes and peaks
and of moves per direction."""

from __future__ import annotations

from dataclasses import dataclass, field

from colossal_contracts import TierName

from .disk._store import DiskIOStats

__all__ = ["ManagerStats", "MoveCounts", "MoveStats", "TierStats"]


@dataclass(frozen=True)
class TierStats:
    """One tier's accounting.

    Attributes:
        name: the tier.
        capacity_bytes: its budget.
        used_bytes: payload bytes held now.
        peak_bytes: highest ``used_bytes`` since the manager started or ``reset_stats``.
        emulated: True for an accelerator emulated on the CPU.
    """

    name: str
    capacity_bytes: int
    used_bytes: int
    peak_bytes: int
    emulated: bool


@dataclass(frozen=True)
class MoveStats:
    """Copies from one tier to another.

    Attributes:
        src: the tier payloads left.
        dst: the tier they arrived on.
        num_bytes: bytes copied.
        count: number of payload moves.
    """

    src: str
    dst: str
    num_bytes: int
    count: int


@dataclass(frozen=True)
class ManagerStats:
    """A snapshot of ``ChunkManager`` accounting.

    Attributes:
        tiers: per tier name, its accounting.
        moves: per (src, dst) pair, the copies made.
        num_chunks: chunks registered (parallel chunks included).
        padding_bytes: bytes of chunks that hold no tensor (over every chunk, one rank's view).
        disk_io: background disk reads and writes so far (None without a disk tier).
        disk_faulted_bytes: bytes of disk payloads used without a read-ahead so far, read by
            page faults on use, not in ``disk_io`` (None without a disk tier; [Note: disk
            fault-ins]).
        disk_unwritten_bytes: bytes moved back to disk so far by mapping the payload kept there
            again instead of writing it ([Note: disk copies]); 0 without a disk tier.
        host_unwritten_bytes: bytes of frozen chunks evicted from the compute tier so far by
            taking their kept host payload back instead of copying ([Note: host copies]).
        frozen_written_bytes: bytes written into frozen chunks' payloads since registration:
            moves to a lower tier that found no unchanged copy there, and shards said to be
            ``written`` (a checkpoint loaded into them) ([Note: frozen chunks]).
    """

    tiers: dict[str, TierStats]
    moves: dict[tuple[str, str], MoveStats] = field(default_factory=dict)
    num_chunks: int = 0
    padding_bytes: int = 0
    disk_io: DiskIOStats | None = None
    disk_faulted_bytes: int | None = None
    disk_unwritten_bytes: int = 0
    host_unwritten_bytes: int = 0
    frozen_written_bytes: int = 0

    @property
    def bytes_moved(self) -> int:
        """Bytes copied between tiers, all directions together."""
        return sum(m.num_bytes for m in self.moves.values())

    @property
    def num_moves(self) -> int:
        return sum(m.count for m in self.moves.values())

    def moved(self, src: str, dst: str) -> MoveStats:
        """The copies from ``src`` to ``dst`` (zeros when there were none)."""
        return self.moves.get((src, dst), MoveStats(src, dst, 0, 0))


class MoveCounts:
    """Bytes and payload moves per (src, dst) tier pair, counted as ``Placement`` moves payloads
    (and for copies made outside it: ``count_copy``)."""

    def __init__(self) -> None:
        self._rows: dict[tuple[str, str], list[int]] = {}  # (src, dst) -> [bytes, count]

    def count(self, src: TierName, dst: TierName, nbytes: int) -> None:
        """Count one move of ``nbytes`` from ``src`` to ``dst``."""
        row = self._rows.setdefault((src.value, dst.value), [0, 0])
        row[0] += nbytes
        row[1] += 1

    def count_copy(self, src: TierName, dst: TierName, nbytes: int) -> None:
        """Count a copy between tiers made outside a move (an optimizer's staging copy); a copy
        within one tier, or of nothing, is not a move."""
        if src is not dst and nbytes > 0:
            self.count(src, dst, nbytes)

    def stats(self) -> dict[tuple[str, str], MoveStats]:
        return {k: MoveStats(k[0], k[1], v[0], v[1]) for k, v in self._rows.items()}

    def clear(self) -> None:
        self._rows.clear()
