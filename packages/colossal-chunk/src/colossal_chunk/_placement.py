"""Where chunk payloads live: the tiers, moves between them, eviction and prefetch.

This is the half of the chunk manager that owns bytes. Every payload change goes through
``Placement`` so that tier accounting ([Note: tier accounting]) and the move counters are exact.
It is composed of its compute-tier room (``room``: what chunks hold there, eviction under the
budget; ``_room.py``), its disk side (``disk``: read-ahead, write-out, kept disk copies;
``disk/_side.py``) and its move counters (``moves``).

[Note: kept chunks] A ``kept`` chunk stays on the compute tier: eviction and prefetch never
pick it (an optimizer placed its states there for the whole run, in room the plan showed free).
Only an explicit ``move`` takes it off; ``give_up_room`` clears the flag. Residency is on the chunk
([Note: chunk residency] in ``_group.py``).

[Note: inline prefetch] On an emulated accelerator a prefetch of a host shard of at most
``inline_copy_bytes`` (1 MiB) is made at once by the calling thread, as a move: there the copy is
a memcpy on the CPU, and handing it to the worker thread costs more than it (submit, wake-up and
wait: several times the copy, measured in docs/chunk.md) and, when the ranks outnumber the cores,
a context switch that no idle core absorbs. Larger shards still go to the worker, which overlaps
them with compute where a core is free. On CUDA every prefetch rides the side stream.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import suppress
from functools import partial

import torch

from colossal_contracts import (
    CapacityError,
    InternalError,
    PlacementPolicy,
    StateTransitionError,
    TierName,
)

from ._accounting import MoveCounts
from ._chunk import Chunk
from ._gathered_cache import GatheredCache
from ._group import Lifecycle
from ._host_copies import HostCopies, down
from ._prefetch import Prefetcher
from ._room import ComputeRoom
from ._spare import SPARE_BYTES, SparePayloads
from ._tier import UNLIMITED, Tier
from .disk._copies import DiskCopies
from .disk._read_ahead import ReadAheadWindow
from .disk._side import DiskSide
from .disk._side import payload_key as _key

__all__ = ["Placement"]

ACC, HOST, DISK = TierName.ACCELERATOR, TierName.HOST, TierName.DISK
_INLINE_COPY_BYTES = 1 << 20  # [Note: inline prefetch]


class Placement:
    """Moves chunk payloads between tiers under their budgets; see the module docstring."""

    tiers: dict[TierName, Tier]
    room: ComputeRoom  # the compute tier's room: bytes held there, evictions
    disk: DiskSide  # read-ahead, write-out, kept disk payloads
    moves: MoveCounts  # bytes and moves per (src, dst)

    def __init__(
        self,
        tiers: dict[TierName, Tier],
        policy: PlacementPolicy,
        budget: Callable[[int], int],
        rebind: Callable[[Chunk], None] = lambda chunk: None,
        *,
        read_ahead_bytes: int = UNLIMITED,
    ):
        """``rebind(chunk)`` is called whenever a chunk's storage changes here, so that views
        into the old storage (parameters' ``.data``) are re-pointed and the old storage freed.
        ``read_ahead_bytes``: the host bytes disk pages read ahead may take ([Note: read-ahead
        window]), reserved on the host tier now."""
        self.tiers = tiers
        self.read_ahead_window = ReadAheadWindow(tiers[HOST], read_ahead_bytes)
        self._rebind = rebind
        self.moves = MoveCounts()
        self._prefetcher: Prefetcher | None = None
        self.spares = SparePayloads(spare_bytes=SPARE_BYTES)  # [Note: spare payloads]
        # [Note: gathered buffer cache]: gathered and all-to-all receive buffers, no budget only
        cached = tiers[ACC].capacity_bytes == UNLIMITED and SparePayloads.serves(tiers[ACC])
        self.gathered = GatheredCache(cached)
        self.workspace = GatheredCache(cached)
        self.disk_copies = DiskCopies(tiers.get(DISK))  # [Note: disk copies]
        self.host_copies = HostCopies(tiers[HOST])  # [Note: host copies]
        self.frozen_written = 0  # bytes written into frozen chunks ([Note: frozen chunks])
        self.inline_copy_bytes = _INLINE_COPY_BYTES  # [Note: inline prefetch]
        self.room = ComputeRoom(tiers, policy, budget, self.offload)
        self.disk = DiskSide(
            tiers, self.read_ahead_window, self.disk_copies, self.spares, self._rebind
        )

    # ----- payloads -----------------------------------------------------------------------------
    def reserve_new(
        self, chunk: Chunk, tier: TierName, *, spill_reserve: int | None = None
    ) -> None:
        """Choose a tier for new ``chunk``: ``tier``, spilling host -> disk; reserve there and set
        ``chunk.tier`` (no payload yet: ``allocate_new``). With ``spill_reserve``, a chunk that
        fits on neither may start on the compute tier if ``spill_reserve`` bytes of the policy's
        room stay free there; it is then kept there ([Note: kept chunks]): no other tier could
        take it if it were evicted."""
        order = [tier] + [t for t in (HOST, DISK) if t is not tier and t in self.tiers]
        for name in order:
            if self._fits(chunk, name):
                self.tiers[name].reserve(chunk.shard_bytes, what=f"chunk {chunk.chunk_id}")
                chunk.tier = name
                return
        acc = self.tiers[ACC]
        room = self.room.limit(0) - (spill_reserve or 0)
        if spill_reserve is not None and acc.used_bytes + chunk.shard_bytes <= room:
            acc.reserve(chunk.shard_bytes, what=f"chunk {chunk.chunk_id}")
            chunk.tier = ACC
            chunk.kept = True
            return
        raise self._no_room_anywhere(chunk)

    def allocate_new(self, chunk: Chunk) -> torch.Tensor:
        """A first shard for ``chunk`` on the tier ``reserve_new`` chose for it."""
        if chunk.tier is None:
            raise InternalError(f"chunk {chunk.chunk_id} has no tier reserved; reserve_new first")
        return self.tiers[chunk.tier].allocate(
            _key(chunk, chunk.tier), chunk.shard_numel, chunk.dtype
        )

    def move(self, chunk: Chunk, dst: TierName, *, copy: bool = True) -> None:
        """Copy ``chunk``'s shard to ``dst`` (reserving there first), free it where it was. Only
        storage moves (new padding zeroed) without ``copy``, while a reduce-scatter in flight will
        overwrite it, or when dead ([Note: dead shards] in ``_shard_io.py``: to disk unwritten)."""
        self.settle(chunk)
        copy = copy and not chunk.awaits_overwrite and not chunk.dead
        unwritten = chunk.dead and dst is DISK
        src = chunk.current_tier
        if src is dst:
            return
        if chunk.pinned:
            raise StateTransitionError(
                f"chunk {chunk.chunk_id} cannot move while a tensor is in COMPUTE; release it first"
            )
        if dst is DISK and self.disk_copies.has(_key(chunk, DISK)):
            self.disk.back_to_disk(chunk)
            return
        if dst is HOST and self.host_copies.has(chunk.chunk_id):
            self.disk.take_kept(chunk, self.host_copies.reuse(chunk.chunk_id), HOST)
            return
        d = self.tiers[dst]
        if dst is DISK:
            self.host_copies.drop(chunk.chunk_id)
            self.disk_copies.make_room(chunk.shard_bytes)
        elif dst is HOST:
            self.host_copies.make_room(chunk.shard_bytes)
        if chunk.frozen and copy and down(src, dst):
            self.frozen_written += chunk.shard_bytes  # no unchanged copy below: written
        d.reserve(chunk.shard_bytes, what=f"chunk {chunk.chunk_id}")
        if copy:
            self.disk.used(chunk)
            self.disk.finish_read(chunk)
        if copy and dst is DISK:  # written into its file ([Note: payloads put] in disk/_store.py)
            chunk.quiesce()
            new = d.put(_key(chunk, dst), chunk.payload)
            old = chunk.replace_shard(new, copy=False)
        else:  # a dead shard's padding is zeroed when it is brought back (uncopied)
            get = d.claim if unwritten else partial(self.spares.allocate, d)
            new = get(_key(chunk, dst), chunk.shard_numel, chunk.dtype)
            if not copy and not unwritten:  # padding is zero in every payload: this rank's part
                new[max(0, chunk.used - chunk.rank * chunk.shard_numel) :].zero_()
            old = chunk.replace_shard(new, copy=copy)
        del new
        if not unwritten:
            d.write_behind(_key(chunk, dst), chunk.payload)
        self._rebind(chunk)  # the old storage's views go: it may become a spare
        s = self.tiers[src]
        if chunk.frozen and copy and src is HOST:  # [Note: host copies]
            self.host_copies.hold(chunk.chunk_id, old)
        else:
            self.spares.give(old, s)
            self.disk.leave(chunk, s, copied=copy)
        del old
        chunk.tier = dst
        self.moves.count(src, dst, chunk.shard_bytes)

    def written(self, chunk: Chunk) -> None:
        """``chunk``'s shard was written in place: a host copy kept for it is stale now, and on
        disk the shard starts being written out (``DiskSide.written``)."""
        self.host_copies.drop(chunk.chunk_id)
        self.disk.written(chunk)

    def offload(self, chunk: Chunk) -> int:
        """Release ``chunk``'s gathered buffer and move its shard off the compute tier.

        Goes to the host, or to disk when the host is full. Returns the compute-tier bytes freed.
        """
        freed = 0
        if chunk.world_size > 1 and chunk.is_gathered and self.release_gathered(chunk):
            self._rebind(chunk)
            freed += chunk.full_bytes
        self.settle(chunk)
        if chunk.tier is ACC:
            order = (HOST, DISK)
            if chunk.frozen and self.disk_copies.has(_key(chunk, DISK)):
                order = (DISK,)  # dropped: its disk payload is unchanged ([Note: host copies])
            for dst in order:
                if dst in self.tiers and self._fits(chunk, dst):
                    self.move(chunk, dst)
                    return freed + chunk.shard_bytes
            raise self._no_room_anywhere(chunk)
        return freed

    def gather(self, chunk: Chunk, *, zero: bool) -> None:
        """Gather (or, with ``zero``, materialise zeros for) ``chunk`` on the compute tier."""
        if chunk.world_size == 1:
            if zero:
                chunk.materialize(chunk.payload)
            return
        if chunk.is_gathered:
            return
        self.tiers[ACC].reserve(chunk.full_bytes, what=f"gathered chunk {chunk.chunk_id}")
        full = self.gathered_buffer(chunk)
        if zero:
            chunk.materialize(full)
        else:
            self.count_staging(chunk)
            chunk.gather(full)

    def gathered_buffer(self, chunk: Chunk) -> torch.Tensor:
        """An uninitialized buffer to gather ``chunk`` into: a kept one ([Note: gathered buffer
        cache]) or a new one from the compute tier. Does not reserve."""
        cached = self.gathered.allocate(chunk.capacity, chunk.dtype)
        if cached is not None:
            return cached
        return self.tiers[ACC].allocate_gathered(chunk.capacity, chunk.dtype)

    def count_staging(self, chunk: Chunk) -> None:
        """A gather of ``chunk`` from its shard off the compute tier copies the shard in (into
        the gathered buffer's own slice): count it as a move of the shard."""
        if chunk.tier is not ACC and chunk.world_size > 1:
            self.moves.count(chunk.current_tier, ACC, chunk.shard_bytes)

    def release_gathered(self, chunk: Chunk) -> bool:
        """Drop ``chunk``'s gathered buffer (``Chunk.release``: this rank's slice is copied back
        into the shard, counted when the shard lives off the compute tier). True if dropped.
        [Note: books follow storage] Views leave a buffer before its bytes leave the books: a
        tracer's non-model bytes (live - books) saw a viewed buffer as a chunk of activations."""
        copies = chunk.lifecycle is not Lifecycle.REDUCING and chunk.tier is not ACC
        copies = copies and not chunk.frozen  # dropped without a copy back ([Note: frozen chunks])
        dropped = chunk.release()
        if dropped is None:
            return False
        self._rebind(chunk)  # [Note: books follow storage]
        self.tiers[ACC].free(chunk.full_bytes)
        self.gathered.give(dropped)
        if copies:
            self.moves.count(ACC, chunk.current_tier, chunk.shard_bytes)
        return True

    def give_up_room(self, chunk: Chunk) -> TierName | None:
        """Give up ``chunk``'s room: the tiers no longer count it (nor keep copies of it, nor a
        gathered buffer), but its shard stays readable until ``discard_payload(chunk, tier)``, ``tier``
        being what this returns (a streaming re-pack reads it while its room is taken by new
        chunks: colossal-chunk's [Note: streaming re-pack])."""
        self.settle(chunk)
        self.disk_copies.drop(_key(chunk, DISK))
        self.host_copies.drop(chunk.chunk_id)
        chunk.kept = False
        if chunk.world_size > 1 and chunk.is_gathered:
            self.tiers[ACC].free(chunk.full_bytes)
        tier, chunk.tier = chunk.tier, None
        if tier is not None:
            self.tiers[tier].free(chunk.shard_bytes)
            if tier is DISK:
                self.read_ahead_window.drop(chunk)
        return tier

    def discard_payload(self, chunk: Chunk, tier: TierName | None) -> None:
        """After ``give_up_room``: ``chunk``'s payload on ``tier`` goes."""
        if tier is not None:
            self.tiers[tier].discard(_key(chunk, tier))
        chunk.shard = chunk.full = None

    def drop_gathered(self, chunk: Chunk, dropped: torch.Tensor | None) -> None:
        """Account for a gathered buffer ``chunk`` gave up (from ``release``/``reduce_scatter``),
        and keep its memory ([Note: gathered buffer cache])."""
        if dropped is not None:
            self._rebind(chunk)  # [Note: books follow storage]
            self.tiers[ACC].free(chunk.full_bytes)
            self.gathered.give(dropped)

    # ----- prefetch -----------------------------------------------------------------------------
    def prefetch(
        self, chunk: Chunk, *, moment: int, target_use: float, chunks: Iterable[Chunk]
    ) -> bool:
        """Start copying ``chunk``'s shard to the compute tier if it fits without evicting anything
        needed before ``target_use`` (a small shard on an emulated accelerator is moved at once:
        [Note: inline prefetch]). Returns True when a copy was issued or made."""
        if chunk.tier is ACC or chunk.prefetch is not None or chunk.pinned:
            return False
        if self.room.from_host(chunk, moment):  # its gather stages the shard ([Note: gathers from
            return False  # the host]): a copy now would only take room from gathered buffers
        acc = self.tiers[ACC]
        if not self.room.room_before(
            chunk.shard_bytes, moment=moment, target_use=target_use, chunks=chunks, skip=chunk
        ):
            return False
        if acc.emulated and chunk.tier is HOST and chunk.shard_bytes <= self.inline_copy_bytes:
            self.move(chunk, ACC)
            return True
        acc.reserve(chunk.shard_bytes, what=f"prefetch of chunk {chunk.chunk_id}")
        dst = self.spares.allocate(acc, _key(chunk, ACC), chunk.shard_numel, chunk.dtype)
        if self._prefetcher is None:
            self._prefetcher = Prefetcher(acc.device)
        src_tier = self.tiers[chunk.current_tier]
        self.disk.used(chunk)
        before = None  # a read-ahead the reader has not taken up: done where the copy runs
        if src_tier.name is DISK:
            before = partial(src_tier.finish_read, _key(chunk, DISK))
        pending = self._prefetcher.copy(dst, chunk.shard, before=before)
        chunk.prefetch = (pending, src_tier)
        self.moves.count(src_tier.name, ACC, chunk.shard_bytes)  # counted when issued
        return True

    def settle(self, chunk: Chunk) -> None:
        """Finish a prefetch of ``chunk`` if one is in flight (the shard then lives on the acc)."""
        entry, chunk.prefetch = chunk.prefetch, None
        if entry is None:
            return
        pending, src = entry
        old = chunk.replace_shard(pending.wait(), copy=False)
        del entry, pending  # the copy's hold on both storages
        self._rebind(chunk)
        if chunk.frozen and src.name is HOST:  # [Note: host copies]
            self.host_copies.hold(chunk.chunk_id, old)
        else:
            self.spares.give(old, src)
            self.disk.leave(chunk, src, copied=True)
        del old
        chunk.tier = ACC

    def settle_all(self, chunks: dict[int, Chunk]) -> None:
        for c in chunks.values():
            if c.prefetch is not None:
                self.settle(c)

    def close(self) -> None:
        if self._prefetcher is not None:
            self._prefetcher.close()
        self.spares.clear()
        self.drop_kept_buffers()
        for t in self.tiers.values():
            if t.store is not None:
                with suppress(Exception):
                    t.store.close()

    def drop_kept_buffers(self) -> None:
        """Free the gathered and receive buffers kept for the next gather or reduce-scatter
        ([Note: gathered buffer cache])."""
        self.gathered.clear()
        self.workspace.clear()

    def _fits(self, chunk: Chunk, name: TierName) -> bool:
        """Whether ``chunk``'s shard fits on tier ``name`` (on disk: its kept payload, or room
        made by dropping others: [Note: disk copies]; on the host: its kept host payload, or
        room made by dropping others when there is no disk tier: [Note: host copies])."""
        if name is DISK:
            if self.disk_copies.has(_key(chunk, DISK)):
                return True
            self.disk_copies.make_room(chunk.shard_bytes)
        elif name is HOST:
            if self.host_copies.has(chunk.chunk_id):
                return True
            if DISK not in self.tiers:  # else the payload goes to disk: the copies stay
                self.host_copies.make_room(chunk.shard_bytes)
        return self.tiers[name].free_bytes >= chunk.shard_bytes

    def _no_room_anywhere(self, chunk: Chunk) -> CapacityError:
        room = ", ".join(f"{n.value} {t.free_bytes:,}" for n, t in self.tiers.items())
        return CapacityError(
            f"chunk {chunk.chunk_id} ({chunk.shard_bytes:,} bytes) fits on no tier (free bytes: "
            f"{room}); raise host_bytes or disk_bytes, or enable the disk tier (disk_bytes=None)"
        )
