"""The chunk manager: registers tensors into chunks, makes them ready for compute, keeps the books.

[Note: parameter views] and [Note: views bound once] are in ``_views.py``.

[Note: access protocol] ``access(params)`` puts every named tensor in COMPUTE, its chunk's shard on
the compute tier and gathered; ``release(params, state=...)`` moves them on (HOLD after forward,
READY_FOR_REDUCE once a gradient is collected). A chunk with a tensor in COMPUTE never moves.
Call ``set_moment(i)`` as each moment begins so the policy knows where the step is. The fast
path: when every chunk is already resident and gathered and the compute tier is within this
moment's room, ``access`` and ``release`` only change states (no tier is touched); otherwise
``access`` first evicts down to the moment's room (which may have shrunk since the last moment).

Collectives on chunks and when they finish are in ``_collectives.py`` ([Note: collectives in
flight], [Note: gathers ahead]); registering tensors into chunks is in ``_register.py``,
re-packing them in first-use order in ``_repack.py``, the step without touching a tier in
``_resident.py`` ([Note: resident fast path]), what an owner says about shards it reads or
writes in place (read ahead, staged, written, read) in ``_shard_io.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
import torch.distributed as dist

from colossal_contracts import (
    ConfigError,
    PlacementPolicy,
    TensorState,
    TierName,
)

from ._accounting import ManagerStats
from ._books import Books
from ._chunk import Chunk
from ._collectives import ManagerCollectives
from ._config import ChunkConfig
from ._group import ChunkGroup, ChunkKind
from ._hooks import ManagerHooks, NoHooks
from ._pending import InFlightCount
from ._placement import Placement
from ._register import ManagerRegistry
from ._repack import ManagerRepack
from ._resident import ManagerResident
from ._shard_io import ShardIO
from ._tier import Tier, build_tiers
from ._views import ParamViews
from .disk._read_ahead import window_bytes
from .policies._base import LruPolicy

__all__ = ["ChunkManager"]

ACC = TierName.ACCELERATOR
_DISK_AHEAD = 4  # moments ahead whose chunks on disk are read into memory early
Tensorish = torch.Tensor | str


def _never(chunk: Chunk) -> bool:
    return False


class ChunkManager(
    ManagerRegistry,
    ManagerResident,
    ManagerCollectives,
    ManagerRepack,
):
    """Chunks of parameters (and parallel chunks of gradients / master weights) under tier budgets.

    See [Note: parameter views] and [Note: access protocol]. ``group`` is the data-parallel process
    group chunks are sharded across (None: one rank, no sharding).
    """

    config: ChunkConfig
    policy: PlacementPolicy
    chunks: dict[int, Chunk]  # every chunk by id, parameter chunks first
    groups: dict[int, ChunkGroup]  # parameter chunk id -> its record ([Note: one record per chunk])
    hooks: ManagerHooks  # told before collectives, asked whether to keep chunks gathered
    in_flight: InFlightCount  # [Note: collectives in flight]
    shard_io: ShardIO  # what an owner says about shards it reads or writes in place
    books: Books  # demand, kept chunks, counted copies, stats

    def __init__(
        self,
        config: ChunkConfig,
        *,
        policy: PlacementPolicy | None = None,
        group: dist.ProcessGroup | None = None,
        hooks: ManagerHooks | None = None,
    ):
        self.config = config
        self.hooks = hooks if hooks is not None else NoHooks()
        if not isinstance(self.hooks, ManagerHooks):
            raise ConfigError(
                f"{type(self.hooks).__name__} is not ManagerHooks: give an object with "
                "before_collective(kind, chunk) and keep_gathered(chunk)"
            )
        self.policy = policy if policy is not None else LruPolicy()
        if not isinstance(self.policy, PlacementPolicy):
            raise ConfigError(
                f"{type(self.policy).__name__} is not a placement policy: subclass "
                "colossal_contracts.PlacementPolicy and override choose_evictions (the other "
                "hooks have no-op defaults)"
            )
        self.group = group
        self.world_size = dist.get_world_size(group) if group is not None else 1
        self.chunks = {}
        self._views = ParamViews()  # [Note: parameter views]
        self._bind = self._views.bind
        self._name = self._views.name
        self.groups = {}
        self._spill: dict[str, int | None] = {}  # twin kind (in the order added) -> spill_reserve
        self._moment = 0
        self._num_moments = 0  # moments of the longest step seen (set_moment), for the room check
        self._steady = False  # fully_resident() said yes and nothing changed since
        self._closed = False
        self._placement = Placement(
            build_tiers(config),
            self.policy,
            self._model_budget,
            rebind=self._bind,
            read_ahead_bytes=window_bytes(config, self.world_size),
        )
        self.in_flight = InFlightCount()
        self.books = Books(
            self._placement, lambda: self.chunks, lambda: self._moment, changed=self._unsteady
        )
        self.shard_io = ShardIO(
            self._placement, self._chunk, move=self.move, keep=self.books.keep_on_compute
        )

    # ----- setup --------------------------------------------------------------------------------
    @property
    def chunk_numel(self) -> int:
        """Elements per chunk: ``config.chunk_numel`` rounded up to a multiple of the world size."""
        return self.config.chunk_numel_for(self.world_size)

    @property
    def frozen_chunk_numel(self) -> int:
        """Elements per frozen chunk ([Note: chunk size per kind] in ``_register.py``):
        ``config.frozen_chunk_numel`` (else ``chunk_numel``) rounded up like ``chunk_numel``."""
        return self.config.chunk_numel_for(self.world_size, frozen=True)

    @property
    def compute_device(self) -> torch.device:
        return self.tiers[ACC].device

    # ----- lookup -------------------------------------------------------------------------------
    def chunk_of(self, item: Tensorish) -> Chunk:
        """The parameter chunk holding ``item`` (a registered parameter or its name)."""
        return self.chunks[self._views.chunk_of[self._name(item)]]

    def group_of(self, chunk: Chunk | int) -> ChunkGroup:
        """The record of parameter chunk ``chunk`` ([Note: one record per chunk] in
        ``_group.py``): its twins and its gradients' state."""
        cid = chunk.chunk_id if isinstance(chunk, Chunk) else chunk
        group = self.groups.get(cid)
        if group is None:
            raise ConfigError(f"chunk {cid} is not a parameter chunk of this manager")
        return group

    def parallel_chunk(self, kind: ChunkKind | str, chunk: Chunk | int) -> Chunk:
        """The ``kind`` twin of parameter chunk ``chunk``."""
        return self.group_of(chunk).twin(kind)

    @property
    def twin_kinds(self) -> tuple[str, ...]:
        """The kinds of twins ``add_parallel`` made, in the order it made them."""
        return tuple(self._spill)

    def param_chunks(self) -> list[Chunk]:
        return [c for c in self.chunks.values() if c.kind == "param"]

    def trainable_chunks(self) -> list[Chunk]:
        """The parameter chunks that are not frozen: those with parallel chunks ([Note: frozen
        chunks] in ``_register.py``)."""
        return [c for c in self.chunks.values() if c.kind == "param" and not c.frozen]

    def _chunk(self, item: Chunk | int) -> Chunk:
        """The manager's chunk of ``item``'s id (a re-pack replaces chunks: the current one)."""
        return self.chunks[item.chunk_id if isinstance(item, Chunk) else item]

    # ----- the step -----------------------------------------------------------------------------
    @property
    def moment(self) -> int:
        return self._moment

    def set_moment(self, moment: int, *, prefetch: int = 0) -> None:
        """Tell the policy the step reached ``moment``; with ``prefetch > 0`` also start copying
        the chunks of the next ``prefetch`` moments to the compute tier (within the budget)."""
        self._moment, self._steady = moment, False
        if moment >= self._num_moments:
            self._num_moments = moment + 1
        self.policy.on_moment(moment)
        if prefetch > 0:
            self.prefetch(prefetch)
        if TierName.DISK in self.tiers:  # [Note: disk read-ahead and write-behind]
            # within this step: the next step's first chunks, read ahead now, would hold the
            # read-ahead window through the optimizer step ([Note: read-ahead window])
            ahead = min(_DISK_AHEAD, self._num_moments - 1 - moment)
            if ahead > 0:
                self.shard_io.read_ahead(self.policy.upcoming(moment, ahead))

    def access(self, items: Iterable[Tensorish]) -> None:
        """Make parameters ready for compute (on the compute tier, gathered, COMPUTE)."""
        by_chunk: dict[int, list[str]] = {}
        for item in items:
            name = self._name(item)
            by_chunk.setdefault(self._views.chunk_of[name], []).append(name)
        if self.in_flight.now:
            for cid in by_chunk:
                self._finish(self.chunks[cid])
        if self._resident(by_chunk):  # fast path ([Note: access protocol])
            self._access_resident(by_chunk)
            return
        self._access(by_chunk, zero=False)

    def access_chunks(
        self, chunks: Iterable[Chunk | int], *, zero: bool = False, discard: bool = False
    ) -> None:
        """Put every tensor of ``chunks`` in COMPUTE on the compute tier. Gathers sharded chunks, or
        with ``zero`` gives them a zero full buffer without communicating (gradient chunks).
        With ``discard`` the shards' values are dead (the caller overwrites every tensor's slot,
        or a reduce-scatter the whole shard): a shard brought to the compute tier is not copied,
        only its padding is zeroed."""
        by_chunk = {}
        for c in chunks:
            chunk = self.chunks[c.chunk_id if isinstance(c, Chunk) else c]
            by_chunk[chunk.chunk_id] = list(chunk.records)
        if not zero and not self.in_flight.now and self._resident(by_chunk):
            self._access_resident(by_chunk)  # the fast path of ``access``
            return
        self._access(by_chunk, zero=zero, discard=discard)

    def _access(self, by_chunk: dict[int, list[str]], *, zero: bool, discard: bool = False) -> None:
        self._steady = False  # bytes may arrive on the compute tier: check the room again
        chunks = [self.chunks[i] for i in by_chunk]
        pl = self._placement
        for c in chunks:
            self._finish(c)
            pl.settle(c)
        staged = set() if zero else {c.chunk_id for c in chunks if pl.from_host(c, self._moment)}
        needed = sum(
            c.full_bytes * (not c.is_gathered)
            if c.chunk_id in staged
            else pl.need_for_access(c, gather=True)
            for c in chunks
        )
        pl.make_room(
            needed,
            self.chunks.values(),
            exclude=by_chunk,
            moment=self._moment,
            what=f"accessing chunks {list(by_chunk)}",
        )
        for c in chunks:
            if c.chunk_id not in staged:  # [Note: gathers from the host]
                pl.move(c, ACC, copy=not discard)
            if not zero and c.world_size > 1 and not c.is_gathered:
                self.hooks.before_collective("all-gather", c)
            pl.gather(c, zero=zero)
            for name in by_chunk[c.chunk_id]:
                c.set_state(name, TensorState.COMPUTE)
            self._bind(c)
        self.policy.on_access(list(by_chunk), self._moment)
        if self.books.tracking:
            self.books.note_demand()

    def release(
        self,
        items: Iterable[Tensorish],
        *,
        state: TensorState = TensorState.HOLD,
        reshard: bool = True,
    ) -> None:
        """Move parameters out of COMPUTE to ``state`` (through ``check_transition``).

        With ``reshard`` a sharded chunk whose tensors are all HOLD drops its gathered buffer.
        """
        touched: dict[int, None] = {}
        for item in items:
            name = self._name(item)
            c = self.chunks[self._views.chunk_of[name]]
            c.set_state(name, state)
            touched[c.chunk_id] = None
        self._after_release([self.chunks[i] for i in touched], reshard)

    def release_chunks(
        self,
        chunks: Iterable[Chunk | int],
        *,
        state: TensorState = TensorState.HOLD,
        reshard: bool = True,
    ) -> None:
        """``release`` for every tensor of ``chunks``."""
        done = []
        for c in chunks:
            chunk = self.chunks[c.chunk_id if isinstance(c, Chunk) else c]
            for name in chunk.records:
                chunk.set_state(name, state)
            done.append(chunk)
        self._after_release(done, reshard)

    def reshard(self, chunks: Iterable[Chunk | int]) -> None:
        """Drop the gathered buffers of ``chunks`` (whose tensors must all be HOLD or FREE) even
        where ``hooks.keep_gathered`` would keep them: their owner writes the shards next,
        outside the access protocol, so a gathered copy would go stale. A collective in flight
        is finished first; a chunk is then evicted as a release would evict it."""
        done = []
        for item in chunks:
            c = self.chunks[item.chunk_id if isinstance(item, Chunk) else item]
            self._finish(c)
            for name in c.records:
                c.set_state(name, TensorState.HOLD)
            done.append(c)
        self._after_release(done, True, keep=_never)

    def _after_release(
        self, chunks: list[Chunk], reshard: bool, *, keep: Callable[[Chunk], bool] | None = None
    ) -> None:
        evict_after = self.policy.evict_after_use
        keep = self.hooks.keep_gathered if keep is None else keep
        for c in chunks:
            moved = False
            if reshard and c.world_size > 1 and c.all_in(TensorState.HOLD) and not keep(c):
                self._placement.release_gathered(c)
                moved = True
            if c.movable and evict_after(c.chunk_id):
                self._placement.offload(c)
                moved = True
            if moved:  # else storage is unchanged: the views still point at it
                self._bind(c)

    # ----- books (the facade's part of ``self.books``) ------------------------------------------
    @property
    def tiers(self) -> dict[TierName, Tier]:
        return self._placement.tiers

    def stats(self) -> ManagerStats:
        """``Books.stats``: per-tier bytes and peaks, moves per direction, disk I/O."""
        return self.books.stats()

    def model_data_bytes(self, tier: TierName | str) -> int:
        """``Books.model_data_bytes``: chunk payload bytes on ``tier`` now."""
        return self.books.model_data_bytes(tier)

    def _unsteady(self) -> None:
        """The step's fast path checks its room again ([Note: resident fast path])."""
        self._steady = False

    def _model_budget(self, moment: int) -> int:
        cap = self.tiers[ACC].capacity_bytes
        return self.policy.model_budget(cap, moment)

    def close(self) -> None:
        """Finish copies in flight and remove disk files. The manager is unusable afterwards."""
        if not self._closed:
            self._placement.settle_all(self.chunks)
            self._placement.close()
            self._closed = True

    def __enter__(self) -> ChunkManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
