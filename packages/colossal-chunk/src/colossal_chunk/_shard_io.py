"""What an owner of chunks (an optimizer, a checkpoint) tells the manager about shards it reads
or writes in place, where they live: which it reads next (read ahead from disk within the
read-ahead window, or now), which it updates on staged host copies, which it wrote or only read
(those on disk are written out, or let go of, in the background), and which kinds keep their
disk copies ([Note: disk read-ahead and write-behind] in ``disk/_io.py``, [Note: read-ahead
window] in ``disk/_read_ahead.py``, [Note: staged updates] in ``disk/_store.py``, [Note: disk
copies] in ``disk/_copies.py``). Without a disk tier most of them only keep the books.
``shards_to_update`` walks an owner's whole update with all of them ([Note: shards to update] in
``_updates.py``).

[Note: dead shards] An owner that consumed a shard's values (an optimizer's gradients after
the update) says so (``dead``): until a tensor of the chunk is used again (any state change:
an access, a gradient written) or a reduce-scatter writes it, a move copies nothing, a move to
disk takes a slot and writes nothing (``Tier.claim``), and nothing reads it ahead. So a gradient
chunk evicted between the update and the next backward costs no disk traffic; the next backward
overwrites every slot (brought in uncopied: ``access(chunks, discard=True)``, or a reduce-scatter
into it).

The manager owns one ``ShardIO`` (``ChunkManager.shard_io``), composed rather than inherited.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import TypeVar

import torch

from colossal_contracts import TierName

from ._chunk import Chunk
from ._placement import Placement
from ._updates import ShardUpdate, UpdateTurn, walk_updates
from .disk._read_ahead import ReadAheadWindow

__all__ = ["ShardIO"]

T = TypeVar("T")


class ShardIO:
    """Read ahead, staged, written and read-done shards; see the module docstring."""

    def __init__(
        self,
        placement: Placement,
        lookup: Callable[[Chunk | int], Chunk],
        *,
        move: Callable[[Chunk, TierName], None],
        keep: Callable[..., None],
    ) -> None:
        """``lookup`` finds the manager's chunk by id (or the current chunk of a chunk's id);
        ``move`` and ``keep`` are the manager's ``move`` and ``books.keep_on_compute``."""
        self._placement, self._chunk = placement, lookup
        self._move, self._keep = move, keep

    def shards_to_update(
        self, items: Sequence[T], plan: Callable[[T], ShardUpdate], *, ahead: int = 2
    ) -> Iterator[tuple[T, UpdateTurn[T]]]:
        """Walk an owner's in-place update item by item: ``(item, turn)`` in order, where
        ``plan(item)`` names the chunks the item's update touches (asked when first needed) and
        ``turn.running()`` is the block to update in; read-ahead before each turn and
        write-back after it are done here ([Note: shards to update] in ``_updates.py``;
        ``ahead``: items read ahead beyond the current one)."""
        disk = TierName.DISK in self._placement.tiers
        return walk_updates(
            self, items, plan, ahead=ahead, disk=disk, move=self._move, keep=self._keep
        )

    def read_ahead(self, chunks: Iterable[Chunk | int]) -> bool:
        """Start reading the shards of ``chunks`` that live on disk into memory (used soon, in
        this order) while the read-ahead window has room; False once it had none ([Note:
        read-ahead window]: the rest are not read ahead)."""
        for c in chunks:
            chunk = self._chunk(c)
            if not self._placement.disk.read_ahead(chunk):
                return False
        return True

    @property
    def read_ahead_window(self) -> ReadAheadWindow:
        """The books of disk pages read ahead of use within the host budget ([Note: read-ahead
        window])."""
        return self._placement.read_ahead_window

    def finish_reads(self, chunks: Iterable[Chunk | int]) -> None:
        """The shards of ``chunks`` are read next where they live (updated in place): on disk,
        their read-aheads not taken up by the reader yet are done on this thread now ([Note:
        disk read-ahead and write-behind] in ``disk/_io.py``)."""
        for c in chunks:
            self._placement.disk.finish_read(self._chunk(c))

    @contextmanager
    def staged(self, chunks: Iterable[Chunk | int]) -> Iterator[None]:
        """While the block runs, the shards of ``chunks`` that live on disk are host copies
        (computed on without a page fault per page of their mapping); when it ends they are
        written back into their payloads with ``pwrite`` and the payloads are their shards again
        (if it raises, the copies are dropped unwritten). Say ``written`` for them after, as for
        shards written in place ([Note: staged updates] in ``disk/_store.py``). The copies replace the
        payloads' pages in this process's memory (those leave it): no budget counts them."""
        out: list[tuple[Chunk, torch.Tensor]] = []
        try:
            for c in chunks:
                chunk = self._chunk(c)
                mapping = self._placement.disk.stage(chunk)
                if mapping is not None:
                    out.append((chunk, mapping))
            yield
        except BaseException:
            for chunk, mapping in out:
                self._placement.disk.unstage(chunk, mapping, write=False)
            raise
        for chunk, mapping in out:
            self._placement.disk.unstage(chunk, mapping, write=True)

    def keep_disk_copies(self, kinds: Iterable[str] = ()) -> None:
        """Say that chunks of ``kinds`` are not written until the next call: one read off disk
        keeps its disk payload, and goes back to disk without a write; no kinds drops every
        payload kept ([Note: disk copies] in ``disk/_copies.py``)."""
        self._placement.disk_copies.keep(frozenset(kinds))

    def written(self, chunks: Iterable[Chunk | int]) -> None:
        """Say that the shards of ``chunks`` were written in place (updated by an optimizer step,
        loaded): those on disk start being written out of memory in the background."""
        for c in chunks:
            chunk = self._chunk(c)
            chunk.dead = False  # [Note: dead shards]
            if chunk.frozen:  # [Note: frozen chunks]: counted, so an owner can show it never is
                self._placement.frozen_written += chunk.shard_bytes
            self._placement.disk.used(chunk)  # [Note: disk fault-ins]
            self._placement.written(chunk)

    def dead(self, chunks: Iterable[Chunk | int]) -> None:
        """Say that the values of the shards of ``chunks`` are consumed ([Note: dead shards]);
        how they were used is said as for any shard (``read_done``, ``written``)."""
        for c in chunks:
            self._chunk(c).dead = True

    def read_done(self, chunks: Iterable[Chunk | int]) -> None:
        """Say that the shards of ``chunks`` were only read in place: those on disk leave this
        process's memory with nothing written (colossal-chunk's [Note: reads let go])."""
        for c in chunks:
            chunk = self._chunk(c)
            self._placement.disk.used(chunk)  # [Note: disk fault-ins]
            self._placement.disk.read_only(chunk)
