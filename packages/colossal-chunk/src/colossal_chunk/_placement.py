"""Where chunk payloads live: the tiers, moves between them, eviction and prefetch.

This is the half of the chunk manager that owns bytes. Every payload change goes through
``Placement`` so that tier accounting ([Note: tier accounting]) and the move counters are exact.
Its disk side (read-ahead, write-out, kept disk copies) is in ``disk/_side.py``, its compute-tier
room in ``_room.py``.

[Note: kept chunks] A ``kept`` chunk stays on the compute tier: eviction and prefetch never
pick it (an optimizer placed its states there for the whole run, in room the plan showed free).
Only an explicit ``move`` takes it off; ``forget`` clears the flag. Residency is on the chunk
([Note: chunk residency] in ``_chunk.py``).

[Note: inline prefetch] On an emulated accelerator a prefetch of a host shard of at most
``inline_copy_bytes`` (1 MiB) is made at once by the calling thread, as a move: there the copy is
a memcpy on the CPU, and handing it to the worker thread costs more than it (submit, wake-up and
wait: ~65 us of CPU for a 260 KB copy of ~17 us, ~110 us for 1 MiB of ~46 us on a loaded 2-core
host) and, when the ranks outnumber the cores, a context switch that no idle core absorbs. Larger
shards still go to the worker, which overlaps them with compute where a core is free. On CUDA
every prefetch rides the side stream.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import suppress
from functools import partial

import torch

from colossal_contracts import (
    CapacityError,
    ConfigError,
    PlacementPolicy,
    StateTransitionError,
    TierName,
)

from ._accounting import MoveStats
from ._chunk import Chunk
from ._config import ChunkConfig
from ._group import Lifecycle
from ._host_copies import HostCopies, HostSide, down
from ._prefetch import Prefetcher
from ._room import ComputeRoom
from ._spare import SparePayloads
from ._tier import UNLIMITED, Tier
from .disk._copies import DiskCopies
from .disk._read_ahead import ReadAheadWindow
from .disk._side import DiskSide
from .disk._side import payload_key as _key
from .disk._store import DiskStore

__all__ = ["Placement", "build_tiers"]

ACC, HOST, DISK = TierName.ACCELERATOR, TierName.HOST, TierName.DISK
_INLINE_COPY_BYTES = 1 << 20  # [Note: inline prefetch]


def build_tiers(config: ChunkConfig) -> dict[TierName, Tier]:
    """The accelerator, host and (unless ``disk_bytes == 0``) disk tiers ``config`` describes."""
    cuda = config.device == "cuda" or (config.device == "auto" and torch.cuda.is_available())
    if config.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device='cuda' but torch sees no CUDA device; use 'auto' or 'cpu'")
    if cuda:
        dev = torch.device("cuda", torch.cuda.current_device())
        acc_cap = config.accelerator_bytes
        if acc_cap is None:
            acc_cap = torch.cuda.mem_get_info(dev)[1]
    else:
        dev = torch.device("cpu")
        acc_cap = UNLIMITED if config.accelerator_bytes is None else config.accelerator_bytes
    tiers = {
        ACC: Tier(ACC, dev, acc_cap, emulated=not cuda),
        HOST: Tier(
            HOST,
            torch.device("cpu"),
            UNLIMITED if config.host_bytes is None else config.host_bytes,
            pin_memory=cuda and config.pin_memory,
        ),
    }
    if config.disk_bytes != 0:
        cap = UNLIMITED if config.disk_bytes is None else config.disk_bytes
        tiers[DISK] = Tier(DISK, torch.device("cpu"), cap, store=DiskStore(config.disk_dir))
    return tiers


class Placement(ComputeRoom, HostSide, DiskSide):
    """Moves chunk payloads between tiers under their budgets; see the module docstring."""

    tiers: dict[TierName, Tier]
    moves: dict[tuple[str, str], list[int]]  # (src, dst) -> [bytes, count]

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
        self.tiers, self.policy, self._budget = tiers, policy, budget
        self.read_ahead_window = ReadAheadWindow(tiers[HOST], read_ahead_bytes)
        self._rebind = rebind
        self.moves = {}
        self._prefetcher: Prefetcher | None = None
        self.spares = SparePayloads()  # [Note: spare payloads]
        self.disk_copies = DiskCopies(tiers.get(DISK))  # [Note: disk copies]
        self.host_copies = HostCopies(tiers[HOST])  # [Note: host copies]
        self.frozen_written = 0  # bytes written into frozen chunks ([Note: frozen chunks])
        self.inline_copy_bytes = _INLINE_COPY_BYTES  # [Note: inline prefetch]

    # ----- accounting ---------------------------------------------------------------------------
    def acc_bytes(self, chunk: Chunk) -> int:
        """Bytes ``chunk`` holds on the compute tier now (shard there, plus a gathered buffer)."""
        n = chunk.shard_bytes if chunk.tier is ACC or chunk.prefetch is not None else 0
        if chunk.world_size > 1 and chunk.is_gathered:
            n += chunk.full_bytes
        return n

    def need_for_access(self, chunk: Chunk, *, gather: bool) -> int:
        """Bytes to add on the compute tier to make ``chunk`` ready for compute (its shard is
        not brought in when it is gathered from the host: ``from_host``)."""
        n = 0 if chunk.tier is ACC or chunk.prefetch is not None else chunk.shard_bytes
        if gather and chunk.world_size > 1:
            if chunk.is_gathered:
                return 0 if chunk.tier is HOST else n
            n += chunk.full_bytes
        return n

    def from_host(self, chunk: Chunk, moment: int) -> bool:
        """Whether sharded ``chunk`` is (to be) gathered straight from its host shard ([Note:
        gathers from the host]): it is so already, or its shard and gathered buffer together
        do not fit in ``moment``'s room beside what is there."""
        if chunk.world_size == 1 or chunk.tier is not HOST or chunk.prefetch is not None:
            return False
        if chunk.is_gathered:
            return True
        need = chunk.shard_bytes + chunk.full_bytes
        return self.tiers[ACC].used_bytes + need > self.limit(moment)

    def demand_bytes(self, chunks: Iterable[Chunk]) -> int:
        """Compute-tier bytes of the chunks that may not leave it now (tensors in COMPUTE or
        awaiting reduction) and of kept chunks: what no eviction can free."""
        return sum(self.acc_bytes(c) for c in chunks if not c.movable or c.kept)

    def count_copy(self, src: TierName, dst: TierName, nbytes: int) -> None:
        """Count a copy between tiers made outside a move (an optimizer's staging copy)."""
        if src is not dst and nbytes > 0:
            self._count(src, dst, nbytes)

    def _count(self, src: TierName, dst: TierName, nbytes: int) -> None:
        row = self.moves.setdefault((src.value, dst.value), [0, 0])
        row[0] += nbytes
        row[1] += 1

    def move_stats(self) -> dict[tuple[str, str], MoveStats]:
        return {k: MoveStats(k[0], k[1], v[0], v[1]) for k, v in self.moves.items()}

    # ----- payloads -----------------------------------------------------------------------------
    def place_new(
        self, chunk: Chunk, tier: TierName, *, spill_reserve: int | None = None
    ) -> torch.Tensor:
        """Reserve and allocate a first shard for ``chunk`` on ``tier``, spilling host -> disk.

        With ``spill_reserve``, a chunk that fits on neither may start on the compute tier if
        ``spill_reserve`` bytes of the policy's room stay free there; it is then kept there
        ([Note: kept chunks]): no other tier could take it if it were evicted."""
        order = [tier] + [t for t in (HOST, DISK) if t is not tier and t in self.tiers]
        for name in order:
            t = self.tiers[name]
            if self._fits(chunk, name):
                t.reserve(chunk.shard_bytes, what=f"chunk {chunk.chunk_id}")
                chunk.tier = name
                return t.allocate(_key(chunk, name), chunk.shard_numel, chunk.dtype)
        acc = self.tiers[ACC]
        room = self.limit(0) - (spill_reserve or 0)
        if spill_reserve is not None and acc.used_bytes + chunk.shard_bytes <= room:
            acc.reserve(chunk.shard_bytes, what=f"chunk {chunk.chunk_id}")
            chunk.tier = ACC
            chunk.kept = True
            return acc.allocate(_key(chunk, ACC), chunk.shard_numel, chunk.dtype)
        raise self._no_room_anywhere(chunk)

    def move(self, chunk: Chunk, dst: TierName, *, copy: bool = True) -> None:
        """Copy ``chunk``'s shard to ``dst`` (reserving there first) and free it where it was;
        without ``copy`` its values are dead and only storage moves (the new shard's padding is
        zeroed, the rest left as allocated). Nothing is copied either while a reduce-scatter in
        flight will overwrite the whole shard (``Chunk.awaits_overwrite``: a gradient shard
        brought in uncopied to take the result, then evicted before the result came)."""
        self.settle(chunk)
        copy = copy and not chunk.awaits_overwrite
        src = chunk.current_tier
        if src is dst:
            return
        if chunk.pinned:
            raise StateTransitionError(
                f"chunk {chunk.chunk_id} cannot move while a tensor is in COMPUTE; release it first"
            )
        if dst is DISK and self.disk_copies.has(_key(chunk, DISK)):
            self._back_to_disk(chunk)
            return
        if dst is HOST and self.host_copies.has(chunk.chunk_id):
            self._back_to_host(chunk)
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
            self.used(chunk)
            self.finish_read(chunk)
        if copy and dst is DISK:  # written into its file ([Note: payloads put] in disk/_store.py)
            chunk.quiesce()
            new = d.put(_key(chunk, dst), chunk.payload)
            old = chunk.replace_shard(new, copy=False)
        else:
            new = self.spares.allocate(d, _key(chunk, dst), chunk.shard_numel, chunk.dtype)
            if not copy:  # padding is zero in every payload: this rank's part of the chunk's tail
                new[max(0, chunk.used - chunk.rank * chunk.shard_numel) :].zero_()
            old = chunk.replace_shard(new, copy=copy)
        del new
        d.write_behind(_key(chunk, dst), chunk.payload)
        self._rebind(chunk)  # the old storage's views go: it may become a spare
        s = self.tiers[src]
        if chunk.frozen and copy and src is HOST:  # [Note: host copies]
            self.host_copies.hold(chunk.chunk_id, old)
        else:
            self.spares.give(old, s)
            self._leave(chunk, s, copied=copy)
        del old
        chunk.tier = dst
        self._count(src, dst, chunk.shard_bytes)

    def written(self, chunk: Chunk) -> None:
        """``chunk``'s shard was written in place: a host copy kept for it is stale now, and on
        disk the shard starts being written out (``DiskSide.written``)."""
        self.host_copies.drop(chunk.chunk_id)
        DiskSide.written(self, chunk)

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
        acc = self.tiers[ACC]
        acc.reserve(chunk.full_bytes, what=f"gathered chunk {chunk.chunk_id}")
        full = acc.allocate_gathered(chunk.capacity, chunk.dtype)
        if zero:
            chunk.materialize(full)
        else:
            self.count_staging(chunk)
            chunk.gather(full)

    def count_staging(self, chunk: Chunk) -> None:
        """A gather of ``chunk`` from its shard off the compute tier copies the shard in (into
        the gathered buffer's own slice): count it as a move of the shard."""
        if chunk.tier is not ACC and chunk.world_size > 1:
            self._count(chunk.current_tier, ACC, chunk.shard_bytes)

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
        if copies:
            self._count(ACC, chunk.current_tier, chunk.shard_bytes)
        return True

    def forget(self, chunk: Chunk) -> None:
        """Give up ``chunk``'s payloads (its shard and any gathered buffer) on every tier."""
        self.settle(chunk)
        self.disk_copies.drop(_key(chunk, DISK))
        self.host_copies.drop(chunk.chunk_id)
        chunk.kept = False
        if chunk.world_size > 1 and chunk.is_gathered:
            self.tiers[ACC].free(chunk.full_bytes)
        if chunk.tier is not None:
            t = self.tiers[chunk.tier]
            t.free(chunk.shard_bytes)
            t.discard(_key(chunk, chunk.tier))
            if chunk.tier is DISK:
                self.read_ahead_window.drop(chunk)
        chunk.shard = chunk.full = None
        chunk.tier = None

    def drop_gathered(self, chunk: Chunk, dropped: torch.Tensor | None) -> None:
        """Account for a gathered buffer ``chunk`` gave up (from ``release``/``reduce_scatter``)."""
        if dropped is not None:
            self._rebind(chunk)  # [Note: books follow storage]
            self.tiers[ACC].free(chunk.full_bytes)

    # ----- prefetch -----------------------------------------------------------------------------
    def prefetch(
        self, chunk: Chunk, *, moment: int, target_use: float, chunks: Iterable[Chunk]
    ) -> bool:
        """Start copying ``chunk``'s shard to the compute tier if it fits without evicting anything
        needed before ``target_use`` (a small shard on an emulated accelerator is moved at once:
        [Note: inline prefetch]). Returns True when a copy was issued or made."""
        if chunk.tier is ACC or chunk.prefetch is not None or chunk.pinned:
            return False
        if self.from_host(chunk, moment):  # its gather stages the shard ([Note: gathers from
            return False  # the host]): a copy now would only take room from gathered buffers
        acc = self.tiers[ACC]
        if not self.room_before(
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
        self.used(chunk)
        before = None  # a read-ahead the reader has not taken up: done where the copy runs
        if src_tier.name is DISK:
            before = partial(src_tier.finish_read, _key(chunk, DISK))
        pending = self._prefetcher.copy(dst, chunk.shard, before=before)
        chunk.prefetch = (pending, src_tier)
        self._count(src_tier.name, ACC, chunk.shard_bytes)  # counted when issued
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
            self._leave(chunk, src, copied=True)
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
        for t in self.tiers.values():
            if t.store is not None:
                with suppress(Exception):
                    t.store.close()

    def _no_room_anywhere(self, chunk: Chunk) -> CapacityError:
        room = ", ".join(f"{n.value} {t.free_bytes:,}" for n, t in self.tiers.items())
        return CapacityError(
            f"chunk {chunk.chunk_id} ({chunk.shard_bytes:,} bytes) fits on no tier (free bytes: "
            f"{room}); raise host_bytes or disk_bytes, or enable the disk tier (disk_bytes=None)"
        )
