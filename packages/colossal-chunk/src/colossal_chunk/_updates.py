"""An owner's in-place update of shards, chunk by chunk (an optimizer step):
``ShardIO.shards_to_update`` walks the owner's items and owns what happens around each one's
update where the shards live.

[Note: shards to update] For each item, in order, the owner's ``ShardUpdate`` names the chunks
its update touches. With a disk tier, before the item's turn the shards of this item and of the
next ``ahead`` ones are read ahead, soonest first, while the read-ahead window has room, and this
item's are read now (not left to the reader); after its turn the shards it wrote start being
written out of memory and those it only read are let go ([Note: disk read-ahead and
write-behind] in ``disk/_io.py``, [Note: read-ahead window] in ``disk/_read_ahead.py``, [Note:
reads let go]). Inside the turn, ``UpdateTurn.running()`` stages the written shards that live on
disk on host copies, written back when it ends ([Note: staged updates] in ``disk/_store.py``),
and, when the update computes on the compute tier, brings the shards it needs there first,
holding there the ones it names while it runs (so that bringing one cannot evict another).
An item whose update needs none of this (everything where it computes, no disk tier) is
updated however the owner likes in its turn (the fast case: several joined into one call); its
``ShardUpdate`` is then never asked for.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Generic, TypeVar

from colossal_contracts import TierName

from ._chunk import Chunk

if TYPE_CHECKING:
    from ._shard_io import ShardIO

__all__ = ["ShardUpdate", "UpdateTurn", "walk_updates"]

ACC = TierName.ACCELERATOR
T = TypeVar("T")


@dataclass(frozen=True)
class ShardUpdate:
    """The chunks one item's in-place update touches ([Note: shards to update]).

    Attributes:
        written: chunks whose shards are written (values, optimizer states, restored
            parameters), in the order they are read ahead.
        read: chunks whose shards are only read (gradients), read ahead after ``written``.
        staged: of ``written``, those updated in the turn itself: on host copies when on disk.
        home: the chunk whose tier is where the update computes (its optimizer states); None:
            where the shards are.
        bring: chunks brought to the compute tier first when ``home`` is there, in this order.
        hold: of ``bring``, those kept there while the update runs (the rest are kept already,
            or may go).
    """

    written: tuple[Chunk, ...]
    read: tuple[Chunk, ...] = ()
    staged: tuple[Chunk, ...] = ()
    home: Chunk | None = None
    bring: tuple[Chunk, ...] = ()
    hold: tuple[Chunk, ...] = ()

    @property
    def chunks(self) -> list[Chunk]:
        """Every chunk it touches, once each, written first: what is read ahead for it."""
        return list(dict.fromkeys((*self.written, *self.read)))


class UpdateTurn(Generic[T]):
    """One item's turn in ``shards_to_update``: its ``ShardUpdate`` (asked for once, when first
    needed) and ``running()``, the block its update runs in."""

    def __init__(
        self,
        io: ShardIO,
        item: T,
        plan: Callable[[T], ShardUpdate],
        move: Callable[[Chunk, TierName], None],
        keep: Callable[..., None],
    ) -> None:
        self.item = item
        self._io, self._plan, self._move, self._keep = io, plan, move, keep

    @cached_property
    def shards(self) -> ShardUpdate:
        """What the item's update touches (the owner's plan, asked once)."""
        return self._plan(self.item)

    @contextmanager
    def running(self) -> Iterator[None]:
        """Stage the written shards on disk, bring what the update needs to the compute tier
        when it computes there (holding it), run the block, let go, write back."""
        s = self.shards
        with self._io.staged(s.staged):
            on_compute = s.home is not None and s.home.tier is ACC
            if on_compute:  # bring values and gradients over; neither may evict the other
                for ch in s.bring:
                    if ch.tier is not ACC:
                        self._move(ch, ACC)
                    if ch in s.hold:
                        self._keep([ch])
            yield
            if on_compute:
                self._keep(s.hold, keep=False)


def walk_updates(
    io: ShardIO,
    items: Sequence[T],
    plan: Callable[[T], ShardUpdate],
    *,
    ahead: int,
    disk: bool,
    move: Callable[[Chunk, TierName], None],
    keep: Callable[..., None],
) -> Iterator[tuple[T, UpdateTurn[T]]]:
    """``ShardIO.shards_to_update``: see [Note: shards to update]."""
    turns = [UpdateTurn(io, item, plan, move, keep) for item in items]
    for i, turn in enumerate(turns):
        if disk:
            for later in turns[i : i + 1 + ahead]:
                if not io.read_ahead(later.shards.chunks):
                    break
            io.finish_reads(turn.shards.chunks)  # read now: not left to the reader
        yield turn.item, turn
        if disk:
            io.read_done(turn.shards.read)
            io.written(turn.shards.written)
