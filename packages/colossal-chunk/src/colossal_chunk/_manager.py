"""The chunk manager: a facade of a dozen verbs over the parts it is composed of.

[Note: parameter views] and [Note: views bound once] are in ``_views.py``.

[Note: access protocol] ``access(items)`` puts every named tensor (every tensor of a chunk given)
in COMPUTE, its chunk's shard on the compute tier and gathered; ``release(items, state=...)``
moves them on (HOLD after forward, READY_FOR_REDUCE once a gradient is collected). A chunk with a
tensor in COMPUTE never moves. Call ``set_moment(i)`` as each moment begins so the policy knows
where the step is. The fast path: when every chunk is already resident and gathered and the
compute tier is within this moment's room, ``access`` and ``release`` only change states (no tier
is touched); otherwise ``access`` first evicts down to the moment's room (which may have shrunk).

Its parts are objects it holds (composition, not mixins): see the class attributes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch
import torch.distributed as dist

from colossal_contracts import ConfigError, PlacementPolicy, TensorState, TierName

from ._books import Books
from ._chunk import Chunk
from ._collectives import Collectives
from ._config import ChunkConfig
from ._group import ChunkGroup
from ._hooks import ManagerHooks, NoHooks
from ._pending import InFlightCount
from ._placement import Placement
from ._register import ChunkRegistry
from ._resident import Residency
from ._shard_io import ShardIO
from ._tier import build_tiers
from .disk._read_ahead import window_bytes
from .policies._base import LruPolicy

__all__ = ["ChunkManager"]

ACC = TierName.ACCELERATOR
_DISK_AHEAD = 4  # moments ahead whose chunks on disk are read into memory early
Tensorish = torch.Tensor | str
Item = torch.Tensor | str | Chunk | int  # a parameter, its name, or a chunk (or its id)


class ChunkManager:
    """Chunks of parameters (and parallel chunks of gradients / master weights) under tier budgets.

    See [Note: parameter views] and [Note: access protocol]. ``group`` is the data-parallel process
    group chunks are sharded across (None: one rank, no sharding).
    """

    policy: PlacementPolicy
    hooks: ManagerHooks  # told before collectives, asked whether to keep chunks gathered
    in_flight: InFlightCount  # [Note: collectives in flight]
    registry: ChunkRegistry  # _register (+ _repack): the chunks, their records, their views
    residency: Residency  # _resident: the moment, moves, prefetches, the fast path
    collectives: Collectives  # _collectives: reduce-scatters, gathers ahead, finishing them
    books: Books  # _books: demand, kept chunks, counted copies, stats, tiers
    shard_io: ShardIO  # _shard_io: what an owner says of shards it reads or writes in place

    def __init__(
        self,
        config: ChunkConfig,
        *,
        policy: PlacementPolicy | None = None,
        group: dist.ProcessGroup | None = None,
        hooks: ManagerHooks | None = None,
    ):
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
        self._closed = False
        tiers = build_tiers(config)
        self._placement = Placement(
            tiers,
            self.policy,
            lambda moment: self.policy.model_budget(tiers[ACC].capacity_bytes, moment),
            rebind=lambda chunk: self.registry.views.bind(chunk),
            read_ahead_bytes=window_bytes(config, self.world_size),
        )
        self.in_flight = InFlightCount()
        self.registry = ChunkRegistry(
            config,
            self._placement,
            self.policy,
            group=group,
            in_flight=self.in_flight,
            changed=lambda: self.residency.unsteady(),
        )
        self.residency = Residency(
            self._placement,
            self.policy,
            self.registry,
            world_size=self.world_size,
            in_flight=self.in_flight,
            tracking=lambda: self.books.tracking,
            bind=self.registry.views.bind,
        )
        self.collectives = Collectives(
            self._placement,
            self.policy,
            self.registry,
            hooks=self.hooks,
            residency=self.residency,
            in_flight=self.in_flight,
            bind=self.registry.views.bind,
        )
        self.books = Books(
            self._placement,
            lambda: self.registry.chunks,
            lambda: self.residency.moment,
            changed=self.residency.unsteady,
        )
        self.shard_io = ShardIO(
            self._placement, self.registry.chunk, move=self.move, keep=self.books.keep_on_compute
        )

    # ----- the records --------------------------------------------------------------------------
    @property
    def config(self) -> ChunkConfig:
        """The chunk sizes and budgets in force (``repack`` may give new sizes)."""
        return self.registry.config

    @property
    def chunks(self) -> dict[int, Chunk]:
        """Every chunk by id, parameter chunks first (a re-pack replaces them)."""
        return self.registry.chunks

    @property
    def groups(self) -> dict[int, ChunkGroup]:
        """Parameter chunk id -> its record ([Note: one record per chunk] in ``_group.py``): the
        parameter chunk, its twins by ``ChunkKind``, its gradients' phase."""
        return self.registry.groups

    def chunk_of(self, item: Tensorish) -> Chunk:
        """The parameter chunk holding ``item`` (a registered parameter or its name)."""
        return self.registry.chunk_of(item)

    # ----- setup --------------------------------------------------------------------------------
    def register(
        self,
        named_params: Iterable[tuple[str, torch.nn.Parameter]],
        *,
        order: Sequence[str] | None = None,
        materialize: Callable[[torch.Tensor], torch.Tensor] | None = None,
        frozen: Iterable[str] = (),
    ) -> list[Chunk]:
        """Pack parameters into new chunks and point their ``.data`` into them.

        ``order`` lists names in first-use order (the compute order); names it lacks follow in the
        given order. A parameter seen twice (tied weights) is registered once. Chunks start on
        ``config.home`` (spilling to host, then disk). With ``materialize``, a parameter's values
        are ``materialize(param)``, asked for one chunk's tensors at a time (lazy initialization).
        Names in ``frozen`` go into frozen chunks ([Note: frozen chunks]) of
        ``frozen_chunk_numel`` elements ([Note: chunk size per kind]). Returns the new chunks.
        """
        return self.registry.register(
            named_params, order=order, materialize=materialize, frozen=frozen
        )

    def add_parallel(
        self,
        kind: str,
        dtype: torch.dtype,
        *,
        copy_params: bool = False,
        values: Callable[[str], torch.Tensor] | None = None,
        spill_reserve: int | None = None,
    ) -> list[Chunk]:
        """A chunk of ``dtype`` with the same layout beside every parameter chunk (gradients, fp32
        master weights, optimizer states). Zeros, or with ``copy_params`` the parameters' values
        cast to ``dtype``, or with ``values`` each parameter's full starting value by name (say,
        the fp32 originals of low-precision parameters), asked for one chunk at a time: each
        twin is written once, its values in place before it goes out to its tier ([Note: twins
        filled once] in ``_register.py``). They start on ``config.home`` like parameter chunks
        (spilling to the host, then disk; with ``spill_reserve``, then to the compute tier while
        that many bytes of its room stay free, kept there: [Note: kept chunks]). Frozen chunks
        get none ([Note: frozen chunks])."""
        return self.registry.add_parallel(
            kind, dtype, copy_params=copy_params, values=values, spill_reserve=spill_reserve
        )

    def repack(
        self,
        order: Sequence[str],
        *,
        chunk_numel: int | None = None,
        frozen_chunk_numel: int | None = None,
    ) -> list[Chunk]:
        """Re-pack every chunk in ``order`` ([Note: first-use order] in ``_repack.py``), in
        chunks of ``chunk_numel`` / ``frozen_chunk_numel`` elements when given (an owner's
        fitted sizes; they replace ``config``'s). Collective when chunks are sharded. Every
        tensor must be HOLD or FREE. Returns the new parameter chunks."""
        self.settle()
        return self.registry.repack(
            order, chunk_numel=chunk_numel, frozen_chunk_numel=frozen_chunk_numel
        )

    # ----- the step -----------------------------------------------------------------------------
    def set_moment(self, moment: int, *, prefetch: int = 0) -> None:
        """Tell the policy the step reached ``moment``; with ``prefetch > 0`` also start copying
        the chunks of the next ``prefetch`` moments to the compute tier (within the budget)."""
        num_moments = self.residency.set_moment(moment)
        self.policy.on_moment(moment)
        if prefetch > 0:
            self.residency.prefetch(prefetch)
        if TierName.DISK in self._placement.tiers:  # [Note: disk read-ahead and write-behind]
            ahead = min(_DISK_AHEAD, num_moments - 1 - moment)  # [Note: read-ahead window]
            if ahead > 0:  # this step's only: the next step's would hold the window
                self.shard_io.read_ahead(self.policy.upcoming(moment, ahead))

    def access(self, items: Iterable[Item], *, zero: bool = False, discard: bool = False) -> None:
        """Make tensors ready for compute (on the compute tier, gathered, COMPUTE): parameters
        (or their names), or every tensor of the chunks given. For chunks only: with ``zero``
        a sharded chunk gets a zero full buffer without communicating (gradient chunks); with
        ``discard`` the shards' values are dead (the caller overwrites every tensor's slot, or a
        reduce-scatter the whole shard): a shard brought to the compute tier is not copied,
        only its padding is zeroed."""
        by_chunk, whole = self.registry.by_chunk(items)
        if whole:
            if not zero and not self.in_flight.now and self.residency.resident(by_chunk):
                self._access_resident(by_chunk)  # the fast path ([Note: access protocol])
                return
            self._access(by_chunk, zero=zero, discard=discard)
            return
        if zero or discard:
            raise ConfigError("access(zero=, discard=) takes chunks, not parameters or names")
        if self.in_flight.now:
            for cid in by_chunk:
                self.collectives.finish(self.chunks[cid])
        if self.residency.resident(by_chunk):  # fast path ([Note: access protocol])
            self._access_resident(by_chunk)
            return
        self._access(by_chunk, zero=False)

    def release(
        self,
        items: Iterable[Item],
        *,
        state: TensorState = TensorState.HOLD,
        reshard: bool = True,
        twin: str | None = None,
    ) -> None:
        """Move tensors (parameters or their names, or every tensor of the chunks given) out of
        COMPUTE to ``state`` (through ``check_transition``). With ``reshard`` a sharded chunk
        whose tensors are all HOLD drops its gathered buffer. With ``twin`` (a kind), the named
        parameters' tensors in their chunk's twin of that kind move instead, and nothing else
        happens to that twin (a gradient twin filled slot by slot, reduced next)."""
        if twin is not None:
            for item in items:
                if isinstance(item, Chunk | int):
                    raise ConfigError("release(twin=) takes parameters or their names, not chunks")
                name = self.registry.views.name(item)
                self.groups[self.registry.views.chunk_of[name]].twin(twin).set_state(name, state)
            return
        chunks, views = self.registry.chunks, self.registry.views
        touched: dict[int, Chunk] = {}
        for item in items:
            if isinstance(item, str | torch.Tensor):  # the common case first: names, parameters
                name = views.name(item)
                c = chunks[views.chunk_of[name]]
                c.set_state(name, state)
            else:
                c = self.registry.chunk(item)
                for name in c.records:
                    c.set_state(name, state)
            touched[c.chunk_id] = c
        self.residency.after_release(list(touched.values()), reshard, self.hooks.keep_gathered)

    def reduce(
        self,
        chunk: Chunk | int,
        *,
        into: Chunk | int | None = None,
        average: bool = True,
        async_op: bool = False,
        read_on_host: bool = False,
    ) -> None:
        """Reduce-scatter a chunk whose tensors are all READY_FOR_REDUCE into each rank's shard
        (averaged over ranks), or into the shard of ``into``, a chunk of the same layout ([Note:
        chunk gradients] in ``_chunk.py``; ``Collectives._reduce_target``); collective over the
        manager's group. Tensors end in HOLD/FREE. With ``async_op`` the shard is written when
        the chunk's collective is finished ([Note: collectives in flight]). ``read_on_host``:
        the result is next read on the host (an optimizer that updates ``into``'s chunk there),
        so a host shard of ``into`` takes it where it is."""
        self.collectives.reduce(
            chunk, into, average=average, async_op=async_op, read_on_host=read_on_host
        )

    def gather_ahead(self, chunks: Iterable[Chunk | int]) -> int:
        """Start all-gathering sharded ``chunks`` for a coming moment within this moment's room
        (``Collectives.gather_ahead``, [Note: gathers ahead]); returns how many started."""
        return self.collectives.gather_ahead(chunks)

    def settle(self, chunks: Iterable[Chunk] | None = None, *, reshard: bool = False) -> None:
        """Finish every prefetch and collective in flight (of ``chunks`` only, when given). Call
        before writing shards outside the access protocol (an optimizer step, restoring
        parameters from fp32 masters): a copy in flight would otherwise bring back old values.
        With ``reshard`` (``chunks`` given, their tensors all HOLD or FREE) their gathered
        buffers are dropped first even where ``hooks.keep_gathered`` would keep them, and a
        chunk is evicted as a release would evict it: the owner writes the shards next, so a
        gathered copy would go stale."""
        if reshard:
            if chunks is None:
                raise ConfigError("settle(reshard=True) takes the chunks to reshard")
            chunks = [self.registry.chunk(c) for c in chunks]
            for c in chunks:
                self.collectives.finish(c)
                for name in c.records:
                    c.set_state(name, TensorState.HOLD)
            self.residency.after_release(chunks, True, lambda c: False)
        self.collectives.settle(chunks)

    def move(self, chunk: Chunk | int, tier: TierName | str, *, keep: bool = False) -> None:
        """Move a chunk's shard to ``tier`` (releasing its gathered buffer if it leaves the compute
        tier); with ``keep`` (the compute tier only) keep it there ([Note: kept chunks]). Raises
        ``CapacityError`` if ``tier`` is full, ``StateTransitionError`` if a tensor is in
        COMPUTE."""
        c, tier = self.registry.chunk(chunk), TierName(tier)
        if keep and tier is not ACC:
            raise ConfigError(f"move(keep=True) keeps chunks on the compute tier, not on {tier}")
        self.collectives.finish(c)
        self.residency.move(c, tier)
        if keep:
            self.books.keep_on_compute([c])

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

    # ----- inside the verbs ---------------------------------------------------------------------
    def _access_resident(self, by_chunk: dict[int, list[str]]) -> None:
        """``access`` when every chunk is gathered on the compute tier and fits: states only."""
        chunks = self.registry.chunks
        for cid, names in by_chunk.items():
            c = chunks[cid]
            for name in names:
                c.set_state(name, TensorState.COMPUTE)
        self.policy.on_access(list(by_chunk), self.residency.moment)
        if self.books.tracking:
            self.books.note_demand()

    def _access(self, by_chunk: dict[int, list[str]], *, zero: bool, discard: bool = False) -> None:
        self.residency.unsteady()  # bytes may arrive on the compute tier: check the room again
        chunks = [self.chunks[i] for i in by_chunk]
        pl, room, moment = self._placement, self._placement.room, self.residency.moment
        for c in chunks:
            self.collectives.finish(c)
            pl.settle(c)
        staged = set() if zero else {c.chunk_id for c in chunks if room.from_host(c, moment)}
        needed = sum(
            c.full_bytes * (not c.is_gathered)
            if c.chunk_id in staged
            else room.need_for_access(c, gather=True)
            for c in chunks
        )
        room.make_room(
            needed,
            self.chunks.values(),
            exclude=by_chunk,
            moment=moment,
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
            self.registry.views.bind(c)
        self.policy.on_access(list(by_chunk), moment)
        if self.books.tracking:
            self.books.note_demand()
