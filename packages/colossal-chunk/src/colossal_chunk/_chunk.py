"""A chunk: one 1-D buffer of one dtype holding many tensors as views, sharded across ranks.

[Note: chunk storage] A chunk of ``capacity`` elements is split into ``world_size`` equal shards;
rank r owns elements ``[r * shard_numel, (r + 1) * shard_numel)``. The shard is the payload at rest
and lives on one tier. To compute, the chunk is *gathered*: a full buffer of ``capacity`` elements on
the compute device is all-gathered from the shards, and its tensors' states go FREE -> HOLD. It is
*released* (full buffer dropped, HOLD -> FREE) only when every tensor is back in HOLD. With one rank
the shard *is* the full buffer: a chunk is always gathered and gather/release do nothing.

[Note: chunk gradients] A gradient chunk has the same layout as its parameter chunk. It is
*materialised* as a zero full buffer (no communication), filled by backward, and reduce-scattered
into each rank's shard (averaging across ranks) when every tensor is READY_FOR_REDUCE. Or the
gradients are written into the parameter chunk's own gathered buffer (dead once backward is done
with each tensor: this rank's values are in its shard) and reduce-scattered from there ``into``
the gradient chunk's shard: the gathered buffer is dropped without copying it back, and the
gradient chunk needs no gathered buffer at all. Until that result lands, the gradient shard's
values are dead (``awaits_overwrite``): a move of it copies nothing.

[Note: one collective in flight] ``start_gather`` and ``start_reduce_scatter`` change the states
and the gathered buffer at once and leave the data to a collective in flight; ``wait()`` finishes
it. A chunk has at most one in flight. Reading the gathered buffer (``view``, ``release``) waits
for a gather first; ``release`` finishes a reduce-scatter (its result is the release), and moving
the shard while one is in flight is an error. Where the gathered buffer is, is the chunk's
``Lifecycle`` (``_group.py``), changed in one place per move against its table of legal moves.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from colossal_contracts import (
    ChunkStateError,
    ConfigError,
    StateTransitionError,
    TensorState,
    TierName,
)

from ._group import Lifecycle
from ._layout import ChunkLayout
from ._pending import GatherBatch, InFlightCount, PendingReduce, _PendingGather
from ._records import FREE, HOLD, READY, TensorRecord
from ._reduce_scatter import launch_reduce_scatter

if TYPE_CHECKING:
    from ._gathered_cache import GatheredCache
    from ._prefetch import PendingCopy
    from ._tier import Tier

__all__ = ["Chunk", "PendingReduce", "TensorRecord"]

# torch 2.13 renamed all_gather_into_tensor (deprecated, warning on every call) to
# all_gather_single.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class Chunk(ChunkLayout):
    """A fixed-size 1-D buffer of tensors; see [Note: chunk storage].

    Where its tensors sit and their states are ``ChunkLayout``'s. The chunk holds storage but
    does no tier accounting: ``ChunkManager`` decides where the shard lives, reserves its bytes,
    and hands the chunk new storage through ``replace_shard``.
    """

    shard: torch.Tensor | None  # 1-D, shard_numel, on self.tier; None before storage is given
    full: torch.Tensor | None  # 1-D, capacity, on the compute device while gathered
    lifecycle: Lifecycle  # where the gathered buffer is ([Note: one collective in flight])
    tier: TierName | None  # where the shard lives (set by the manager): [Note: chunk residency]
    prefetch: (
        tuple[PendingCopy, Tier] | None
    )  # a copy to the compute tier in flight, and its source
    kept: bool  # stays on the compute tier ([Note: kept chunks])
    read_ahead_bytes: int  # of its disk shard, read ahead within the window
    dead: bool  # its shard's values are consumed until it is used again ([Note: dead shards])
    flights: InFlightCount | None  # its manager's count of collectives in flight
    _inflight: PendingReduce | _PendingGather | None  # [Note: one collective in flight]
    _incoming: PendingReduce | None  # a reduce in flight that will overwrite this whole shard
    bound: object  # what the parameter views were last pointed at ([Note: views bound once])

    def __init__(
        self,
        chunk_id: int,
        capacity: int,
        dtype: torch.dtype,
        *,
        kind: str = "param",
        group: dist.ProcessGroup | None = None,
        frozen: bool = False,
    ):
        super().__init__(chunk_id, capacity, dtype, kind=kind, group=group, frozen=frozen)
        self.shard, self.full, self.tier = None, None, None
        self.lifecycle = Lifecycle.SHARDED
        self.prefetch, self.kept, self.read_ahead_bytes, self.dead = None, False, 0, False
        self.flights = None
        self._inflight = None
        self._incoming = None
        self.bound = None

    def same_layout(self, chunk_id: int, dtype: torch.dtype, kind: str) -> Chunk:
        """A new empty chunk with this chunk's tensors at the same offsets (a parallel chunk)."""
        twin = Chunk(chunk_id, self.capacity, dtype, kind=kind, group=self.group)
        twin.flights = self.flights
        for rec in self.records.values():
            twin.add(rec.name, rec.shape)
        return twin

    def _move(self, new: Lifecycle) -> None:
        """Every lifecycle move after ``fill_shard`` set the first state: checked against its
        table, and counted in the manager's collectives in flight ([Note: collectives in flight] in ``_pending.py``)."""
        old = self.lifecycle
        self.lifecycle = old.to(new, self.chunk_id)
        if self.flights is not None and old.in_flight != new.in_flight:
            self.flights.moved(started=new.in_flight)

    # ----- storage ------------------------------------------------------------------------------
    @property
    def is_gathered(self) -> bool:
        return self.full is not None

    @property
    def payload(self) -> torch.Tensor:
        """The shard's storage, for a chunk that has it; ``ChunkStateError`` before the manager
        gave it one (``shard`` is None then)."""
        if self.shard is None:
            raise ChunkStateError(f"chunk {self.chunk_id} has no shard storage yet")
        return self.shard

    @property
    def current_tier(self) -> TierName:
        """The tier the shard lives on; ``ChunkStateError`` before it was placed (``tier`` is
        None then)."""
        if self.tier is None:
            raise ChunkStateError(f"chunk {self.chunk_id} is not placed on any tier yet")
        return self.tier

    def fill_shard(self, storage: torch.Tensor, tensors: Mapping[str, torch.Tensor]) -> None:
        """Take ``storage`` (1-D, shard_numel) as the shard and copy this rank's slice of each tensor.

        ``tensors`` holds the full (unsharded) value of every tensor in the chunk; padding is zeroed.
        """
        if storage.numel() != self.shard_numel or storage.dtype != self.dtype:
            raise ConfigError(f"chunk {self.chunk_id}: shard storage has the wrong size or dtype")
        storage.zero_()
        lo, hi = self.rank * self.shard_numel, (self.rank + 1) * self.shard_numel
        for rec in self.records.values():
            a, b = max(lo, rec.offset), min(hi, rec.end)
            if a >= b:
                continue
            src = tensors[rec.name].detach().reshape(-1)[a - rec.offset : b - rec.offset]
            storage[a - lo : b - lo].copy_(src)
        self.shard = storage
        self.full = storage if self.world_size == 1 else None
        self.lifecycle = Lifecycle.GATHERED if self.world_size == 1 else Lifecycle.SHARDED

    def replace_shard(self, storage: torch.Tensor, *, copy: bool = True) -> torch.Tensor:
        """Make ``storage`` the shard and return the old shard storage.

        With ``copy`` the payload is copied into ``storage`` first (a move between tiers); without,
        the caller has already filled it (a prefetch that copied on another thread or stream).
        """
        if self.shard is None:
            raise ChunkStateError(f"chunk {self.chunk_id} has no shard storage yet")
        self.quiesce()
        if copy:
            storage.copy_(self.shard)
        old, self.shard = self.shard, storage
        if self.world_size == 1:
            self.full = storage
        return old

    def quiesce(self) -> None:
        """Finish a gather in flight, so that the shard holds its final values for a move.
        Raises while a reduce-scatter is in flight (its result lands in the shard: ``wait()``
        for it first)."""
        if self.lifecycle is Lifecycle.REDUCING:
            raise ChunkStateError(
                f"chunk {self.chunk_id}: finish its reduce-scatter (wait()) before moving it"
            )
        if self.lifecycle is Lifecycle.GATHERING:
            self.wait()

    def gather(self, full: torch.Tensor) -> None:
        """All-gather the shards into ``full`` (1-D, capacity, on the compute device); FREE -> HOLD.

        Collective: every rank of the group must call it. A shard on another device (the host)
        is first copied into its own slice of ``full``, then gathered in place.
        """
        self.start_gather(full)
        self.wait()

    def start_gather(self, full: torch.Tensor, *, batch: GatherBatch | None = None) -> None:
        """``gather`` as an async collective ([Note: one collective in flight]): ``full`` and the
        states are set now, the data is there once ``wait()`` ran; inside ``with batch:`` the
        collective starts with the batch's others when the block ends. Nothing happens when the
        chunk is already gathered (or gathering)."""
        if self.world_size == 1 or self.full is not None:
            return
        if self.shard is None:
            raise ChunkStateError(f"chunk {self.chunk_id} has no shard storage yet")
        src = self.shard
        if src.device != full.device:  # a host shard: staged into its own slice, gathered in place
            src = full.narrow(0, self.rank * self.shard_numel, self.shard_numel)
            src.copy_(self.shard, non_blocking=True)
        work = _all_gather(full, src, group=self.group, async_op=True)
        self.full = full
        self._move(Lifecycle.GATHERING)
        self._inflight = _PendingGather(work if batch is None else batch)
        for rec in self.records.values():
            self._set(rec, HOLD)

    @property
    def in_flight(self) -> bool:
        """True while a gather or reduce-scatter of this chunk is in flight."""
        return self.lifecycle.in_flight

    def wait(self) -> torch.Tensor | None:
        """Finish the collective in flight, if any. Returns the gathered buffer a finished
        reduce-scatter dropped (for the caller's accounting), else None."""
        pending, self._inflight = self._inflight, None
        if pending is None:
            return None
        if isinstance(pending, _PendingGather):
            pending.wait()
            self._move(Lifecycle.GATHERED)
            return None
        return pending.wait()

    def materialize(self, full: torch.Tensor) -> None:
        """Use ``full`` (zeroed here) as the gathered buffer without communicating; FREE -> HOLD."""
        if self.world_size == 1:
            if self.full is None:
                raise ChunkStateError(f"chunk {self.chunk_id} has no shard storage yet")
            self.full.zero_()
            return
        if self.full is not None:
            raise ChunkStateError(f"chunk {self.chunk_id} is already gathered")
        full.zero_()
        self.full = full
        self._move(Lifecycle.GATHERED)
        for rec in self.records.values():
            self._set(rec, HOLD)

    def release(self) -> torch.Tensor | None:
        """Drop the gathered buffer (HOLD -> FREE), keeping this rank's slice in the shard.

        Returns the dropped buffer (for the caller's accounting), or None when there is nothing to
        release (one rank). Raises ``StateTransitionError`` unless every tensor is in HOLD.
        """
        if self.lifecycle.in_flight:
            dropped = self.wait()
            if dropped is not None:  # a reduce-scatter finished: the shard holds its result
                return dropped
        if self.world_size == 1 or self.full is None:
            return None
        busy = [r.name for r in self.records.values() if r.code != HOLD]
        if busy:
            raise StateTransitionError(
                f"chunk {self.chunk_id} cannot release its gathered storage while tensors are not "
                f"in HOLD: {busy[:4]}; release them first"
            )
        if not self.frozen:  # a frozen chunk's slice equals its shard: nothing wrote it
            if self.shard is None:
                raise ChunkStateError(f"chunk {self.chunk_id} has no shard storage to release into")
            lo = self.rank * self.shard_numel
            self.shard.copy_(self.full[lo : lo + self.shard_numel])
        old, self.full = self.full, None
        self._move(Lifecycle.SHARDED)
        for rec in self.records.values():
            self._set(rec, FREE)
        return old

    def reduce_scatter(
        self, *, average: bool = True, into: Chunk | None = None
    ) -> torch.Tensor | None:
        """Reduce-scatter the gathered buffer into this rank's shard (or ``into``'s: a chunk of
        the same layout and dtype, [Note: chunk gradients]) and drop it.

        Every tensor must be READY_FOR_REDUCE; afterwards they are HOLD (one rank) or FREE (sharded).
        Collective. Returns the dropped buffer (None with one rank, where the shard is the buffer).
        """
        return self.start_reduce_scatter(average=average, into=into).wait()

    def start_reduce_scatter(
        self,
        *,
        average: bool = True,
        accumulate: bool = False,
        into: Chunk | None = None,
        workspace: GatheredCache | None = None,
    ) -> PendingReduce:
        """``reduce_scatter`` as an async collective: states change now, the shard when the
        returned handle's ``wait()`` runs (call it before reading the shard or reducing again).
        ``accumulate`` adds the result to the shard instead of overwriting it (with one rank the
        buffer *is* the shard, so the caller accumulates into it directly). With ``into`` the
        result goes to that chunk's shard, wherever it lives when the collective finishes, and
        this chunk's shard is left as it is; one rank: only the states change. ``workspace``:
        where a collective's scratch buffer comes from ([Note: reduce-scatter on gloo])."""
        if self._counts[READY] != len(self.records):
            waiting = [r.name for r in self.records.values() if r.code != READY]
            raise StateTransitionError(
                f"chunk {self.chunk_id} cannot reduce before every tensor is READY_FOR_REDUCE; "
                f"still waiting on {waiting[:4]}"
            )
        for rec in self.records.values():
            self._set(rec, HOLD)
        if self.world_size == 1:
            return PendingReduce(self, None, None, average=False, accumulate=False)
        if self.shard is None or self.full is None:
            raise ChunkStateError(f"chunk {self.chunk_id} has no gathered buffer to reduce")
        if into is not None and (into.capacity, into.dtype) != (self.capacity, self.dtype):
            raise ConfigError(
                f"chunk {self.chunk_id} cannot reduce into chunk {into.chunk_id}: layouts differ"
            )
        out = torch.empty_like(self.shard, device=self.full.device)
        # [Note: reduce-scatter on gloo]
        work = launch_reduce_scatter(out, self.full, self.group, workspace=workspace)
        pending = PendingReduce(self, out, work, average=average, accumulate=accumulate, into=into)
        self._inflight = pending
        self._move(Lifecycle.REDUCING)
        if into is not None and not accumulate:
            into._incoming = pending
        return pending

    @property
    def awaits_overwrite(self) -> bool:
        """True while a reduce-scatter ``into`` this chunk, not accumulating, is in flight: its
        shard's values are dead, as the result will overwrite all of it wherever the shard then
        lives (a move need not copy them)."""
        return self._incoming is not None and not self._incoming.done

    def _finish_reduce(
        self, out: torch.Tensor, *, average: bool, accumulate: bool, into: Chunk | None
    ) -> torch.Tensor | None:
        if average:
            out.div_(self.world_size)
        dst = self.shard if into is None else into.shard
        if into is not None:
            into._incoming, into.dead = None, False
        if dst is None:
            raise ChunkStateError(f"chunk {self.chunk_id}: no shard storage to reduce into")
        if accumulate:
            dst.add_(out)
        else:
            dst.copy_(out)
        old, self.full = self.full, None
        self._move(Lifecycle.SHARDED)
        for rec in self.records.values():
            self._set(rec, FREE)
        return old

    # ----- tensors ------------------------------------------------------------------------------
    def set_state(self, name: str, new: TensorState) -> None:
        """``ChunkLayout.set_state``; a tensor in use makes the values live ([Note: dead shards])."""
        self.dead = False
        super().set_state(name, new)

    def view(self, name: str) -> torch.Tensor:
        """The tensor ``name`` as a view into the gathered buffer (raises if not gathered)."""
        rec = self.records[name]
        if self.full is None:
            raise ChunkStateError(
                f"tensor {name!r} of chunk {self.chunk_id} is not gathered; access it first"
            )
        if self.lifecycle is Lifecycle.GATHERING:
            self.wait()
        return self.full[rec.offset : rec.end].view(rec.shape)

    def shard_view(self, name: str) -> tuple[torch.Tensor, int, int] | None:
        """This rank's part of tensor ``name``: (1-D view into the shard, start, end) in the
        tensor's flattened elements, or None when the shard holds none of it."""
        span = self._spans[name]
        if span is None or self.shard is None:
            return None
        a, b, start, end = span
        return self.shard[a:b], start, end

    def shard_part(self, name: str) -> torch.Tensor:
        """This rank's part of tensor ``name`` (1-D view into the shard), for a tensor the caller
        knows this rank holds a part of; ``ChunkStateError`` when it holds none."""
        part = self.shard_view(name)
        if part is None:
            raise ChunkStateError(
                f"this rank's shard of chunk {self.chunk_id} holds no part of {name!r}"
            )
        return part[0]

    def __repr__(self) -> str:
        return (
            f"Chunk(id={self.chunk_id}, kind={self.kind}, dtype={self.dtype}, "
            f"used={self.used}/{self.capacity}, tier={self.tier}, gathered={self.is_gathered})"
        )
