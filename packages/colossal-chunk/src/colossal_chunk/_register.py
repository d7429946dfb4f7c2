"""Registering tensors into the chunk manager's chunks: parameters packed into new chunks
([Note: packing] in ``_search.py``), and parallel chunks of the same layout beside them
(gradients, fp32 masters, optimizer states).

[Note: frozen chunks] Parameters registered as ``frozen`` (an owner's ``requires_grad=False``
ones) are only ever read. They are packed into chunks of their own (``Chunk.frozen``), never
beside tensors that are written, so that such a chunk costs its payload in the compute dtype and
nothing else: ``add_parallel`` gives it no twin (no gradient, master or optimizer state), a
gathered buffer is dropped without copying it back, and its disk payload is kept while it is
read elsewhere (``DiskCopies``), so that evicting it to disk again writes nothing. The bytes
written into frozen chunks after registration are counted (``ManagerStats.frozen_written_bytes``)
so an owner can show that none are.

[Note: chunk size per kind] Frozen and trainable chunks each have their own size
(``ChunkConfig.frozen_chunk_numel`` and ``chunk_numel``): a trainable element costs its value,
a master, a gradient and optimizer states, a frozen one its value alone, and the two kinds'
tensors differ in size (LoRA: large frozen base matrices, small adapters). With one size for
both, the size is at least the largest frozen matrix, and the few trainable elements sit in a
chunk mostly padding at the trainable cost per element: LoRA r8 on GPT 18 x 1024 (2.4M adapter
elements in chunks of 4.2M, 44% padding, 26 MB of it at 14 B an element). Each size is chosen
for its own kind's tensors (colossal-zero's Gemini runs ``search_chunk_size`` on each): the
largest LoRA fit under 32 MiB + 512 MiB went from 227.0M to 252.2M parameters (benchmark
lora_capacity).

[Note: twins filled once] A twin that starts with values of its own (the fp32 masters of
low-precision parameters) is filled from ``add_parallel(values=)`` as it is made, one chunk's
values at a time, and then goes out to its tier: filling it afterwards through its payload wrote
every disk payload twice (zeros, then the values through the mapping) and left the values' pages
mapped in the process until the first update staged them. A bf16 GPT of 450M parameters with
its masters on disk held 1.4 GiB of them at the end of setup (the process's file pages, beside
1.7 GiB of its own memory); a 5.3B one, most of its 21 GB of masters.

The manager holds one ``ChunkRegistry`` (``ChunkManager.registry``): the chunks by id, each
parameter chunk's ``ChunkGroup``, the parameters' views, and the lookups over them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence

import torch
import torch.distributed as dist

from colossal_contracts import ConfigError, PlacementPolicy, StateTransitionError, TierName

from ._chunk import Chunk
from ._config import ChunkConfig
from ._group import ChunkGroup, ChunkKind
from ._host_memory import host_empty
from ._pending import InFlightCount
from ._placement import Placement
from ._repack import OldChunks
from ._views import ParamViews
from .policies._base import ChunkSummary, PolicyContext

__all__ = ["ChunkRegistry"]

ACC = TierName.ACCELERATOR
Tensorish = torch.Tensor | str
Item = torch.Tensor | str | Chunk | int  # a parameter, its name, or a chunk (or its id)


class ChunkRegistry:
    """The manager's chunks and what names them; ``register``, ``add_parallel`` and ``repack``
    fill them (see the module docstring)."""

    config: ChunkConfig  # the chunk sizes in force (a re-pack may give new ones)
    chunks: dict[int, Chunk]  # every chunk by id, parameter chunks first
    groups: dict[int, ChunkGroup]  # parameter chunk id -> its record ([Note: one record per chunk])
    views: ParamViews  # [Note: parameter views]

    def __init__(
        self,
        config: ChunkConfig,
        placement: Placement,
        policy: PlacementPolicy,
        *,
        group: dist.ProcessGroup | None,
        in_flight: InFlightCount,
        changed: Callable[[], None],
    ) -> None:
        """``group``: the process group chunks are sharded across; ``in_flight``: where chunks
        count their collectives; ``changed``: called when the layout changes (the step's fast
        path checks its room again)."""
        self.config, self._placement, self._policy = config, placement, policy
        self.group, self._in_flight, self._changed = group, in_flight, changed
        self.world_size = dist.get_world_size(group) if group is not None else 1
        self.chunks, self.groups = {}, {}
        self.views = ParamViews()
        self._spill: dict[str, int | None] = {}  # twin kind (in the order added) -> spill_reserve

    # ----- lookups ------------------------------------------------------------------------------
    @property
    def chunk_numel(self) -> int:
        """Elements per chunk: ``config.chunk_numel`` rounded up to a multiple of the world size."""
        return self.config.chunk_numel_for(self.world_size)

    @property
    def frozen_chunk_numel(self) -> int:
        """Elements per frozen chunk ([Note: chunk size per kind]): ``config.frozen_chunk_numel``
        (else ``chunk_numel``) rounded up like ``chunk_numel``."""
        return self.config.chunk_numel_for(self.world_size, frozen=True)

    def chunk(self, item: Chunk | int) -> Chunk:
        """The chunk of ``item``'s id (a re-pack replaces chunks: the current one)."""
        return self.chunks[item.chunk_id if isinstance(item, Chunk) else item]

    def chunk_of(self, item: Tensorish) -> Chunk:
        """The parameter chunk holding ``item`` (a registered parameter or its name)."""
        return self.chunks[self.views.chunk_of[self.views.name(item)]]

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
        chunks])."""
        return [c for c in self.chunks.values() if c.kind == "param" and not c.frozen]

    def registration_order(self) -> list[str]:
        """Parameter names in the order they sit in chunks."""
        return [n for c in self.param_chunks() for n in c.records]

    def by_chunk(self, items: Iterable[Item]) -> tuple[dict[int, list[str]], bool]:
        """Chunk id -> the names of its tensors that ``items`` (parameters, their names, or chunks:
        every tensor) name, and whether any item was a chunk."""
        name_of, chunk_of, whole = self.views.name, self.views.chunk_of, False
        by_chunk: dict[int, list[str]] = {}
        for item in items:
            if isinstance(item, str | torch.Tensor):  # the common case first: names, parameters
                name = name_of(item)
                by_chunk.setdefault(chunk_of[name], []).append(name)
                continue
            chunk = self.chunk(item)
            by_chunk[chunk.chunk_id] = list(chunk.records)
            whole = True
        return by_chunk, whole

    # ----- filling ------------------------------------------------------------------------------
    def register(
        self,
        named_params: Iterable[tuple[str, torch.nn.Parameter]],
        *,
        order: Sequence[str] | None,
        materialize: Callable[[torch.Tensor], torch.Tensor] | None,
        frozen: Iterable[str],
    ) -> list[Chunk]:
        """``ChunkManager.register`` (its defaults and docstring are there)."""
        fresh, new = self._pack(named_params, order, frozen)
        for c in new:
            tensors = {
                n: materialize(fresh[n]) if materialize else fresh[n].data for n in c.records
            }
            self._placement.reserve_new(c, TierName(self.config.home))
            self._fill(c, tensors)
            del tensors  # lazy init: this chunk's values go before the next chunk's are made
            self.views.bind(c)
        self._bind_policy()
        return new

    def _pack(
        self,
        named_params: Iterable[tuple[str, torch.nn.Parameter]],
        order: Sequence[str] | None,
        frozen: Iterable[str],
    ) -> tuple[dict[str, torch.nn.Parameter], list[Chunk]]:
        """``register``'s layout: the parameters not registered yet by name, and new chunks
        (records and name books filled, no payload yet) holding them."""
        self._changed()
        fresh: dict[str, torch.nn.Parameter] = {}
        for name, p in named_params:
            if self.views.knows(name, p) or any(q is p for q in fresh.values()):
                continue
            fresh[name] = p
        rank = {n: i for i, n in enumerate(order or ())}
        given = {n: i for i, n in enumerate(fresh)}
        names = sorted(fresh, key=lambda n: (rank.get(n, len(rank)), given[n]))
        read_only = frozenset(frozen)
        open_chunk: dict[tuple[torch.dtype, bool], Chunk] = {}
        new: list[Chunk] = []
        for name in names:
            p = fresh[name]
            key = (p.dtype, name in read_only)
            c = open_chunk.get(key)
            if c is None or not c.fits(p.numel()):
                numel = self.frozen_chunk_numel if key[1] else self.chunk_numel
                c = Chunk(self._next_id(), numel, p.dtype, group=self.group, frozen=key[1])
                c.flights = self._in_flight
                self.chunks[c.chunk_id] = c
                self.groups[c.chunk_id] = ChunkGroup(c)
                open_chunk[key] = c
                new.append(c)
            c.add(name, p.shape)
            self.views.add(name, p, c.chunk_id)
        return fresh, new

    def _fill(self, chunk: Chunk, tensors: Mapping[str, torch.Tensor]) -> None:
        """Allocate ``chunk``'s first shard on the tier reserved for it and fill it with this
        rank's slice of ``tensors`` (full values by name)."""
        chunk.fill_shard(self._placement.allocate_new(chunk), tensors)
        self._placement.written(chunk)

    def add_parallel(
        self,
        kind: str,
        dtype: torch.dtype,
        *,
        copy_params: bool,
        values: Callable[[str], torch.Tensor] | None,
        spill_reserve: int | None,
    ) -> list[Chunk]:
        """``ChunkManager.add_parallel`` (its defaults and docstring are there)."""
        if kind == "param" or kind in self._spill:
            raise ConfigError(f"parallel chunk kind {kind!r} is taken; pick another name")
        if copy_params and values is not None:
            raise ConfigError(
                f"add_parallel({kind!r}): give copy_params or values, not both (values: each "
                "parameter's starting value by name; copy_params: the parameters' own)"
            )
        self._changed()
        twins = []
        for cid in [c.chunk_id for c in self.chunks.values() if c.kind == "param" and not c.frozen]:
            src = self.chunks[cid]
            if values is not None:  # one chunk's values at a time ([Note: twins filled once])
                vals = {n: values(n) for n in src.records}
            elif copy_params:
                vals = {n: self._full_value(src, n) for n in src.records}
            else:
                # fresh mappings read as zeros without taking memory ([Note: host payloads])
                vals = {n: host_empty(r.numel, dtype).view(r.shape) for n, r in src.records.items()}
            twin = self._new_twin(src, kind, dtype, spill_reserve)
            self._fill(twin, vals)
            del vals  # this chunk's values go before the next chunk's are made
            twins.append(twin)
        self._spill[kind] = spill_reserve
        self._bind_policy()
        return twins

    def _new_twin(
        self, src: Chunk, kind: str, dtype: torch.dtype, spill_reserve: int | None
    ) -> Chunk:
        """A ``kind`` twin of parameter chunk ``src`` with the next id, its tier reserved as
        ``add_parallel`` reserves it, on ``src``'s record; no payload yet (``_fill``)."""
        twin = src.same_layout(self._next_id(), dtype, kind)
        self.chunks[twin.chunk_id] = twin
        self._placement.reserve_new(twin, TierName(self.config.home), spill_reserve=spill_reserve)
        self.groups[src.chunk_id].twins[kind] = twin
        return twin

    def _full_value(self, chunk: Chunk, name: str) -> torch.Tensor:
        # Only this rank's slice is needed by fill_shard; others are zero-filled placeholders.
        rec = chunk.records[name]
        out = torch.zeros(rec.numel, dtype=chunk.dtype)
        part = chunk.shard_view(name)
        if part is not None:
            view, a, b = part
            out[a:b] = view.cpu()
        return out.view(rec.shape)

    def _next_id(self) -> int:
        return len(self.chunks)

    def _bind_policy(self) -> None:
        summaries = tuple(
            ChunkSummary(c.chunk_id, c.kind, c.shard_bytes) for c in self.chunks.values()
        )
        capacity = self._placement.tiers[ACC].capacity_bytes
        self._policy.bind(PolicyContext(summaries, dict(self.views.chunk_of), capacity))

    def repack(
        self, order: Sequence[str], *, chunk_numel: int | None, frozen_chunk_numel: int | None
    ) -> list[Chunk]:
        """``ChunkManager.repack`` once nothing is in flight: re-pack every chunk in ``order``
        ([Note: first-use order], [Note: streaming re-pack] in ``_repack.py``), in chunks of the
        given sizes when given. Returns the new parameter chunks."""
        busy = [c.chunk_id for c in self.chunks.values() if not c.movable]
        if busy:
            raise StateTransitionError(
                f"cannot re-pack chunks while chunks {busy[:4]} hold tensors in use; release them"
            )
        old = OldChunks(list(self.chunks.values()), self._placement, self.group)
        spill, dtypes = dict(self._spill), old.kinds()
        kinds = {k: dtypes[k] for k in spill if k in dtypes}  # in the order they were added
        params = dict(self.views.params)
        for name, p in params.items():  # its shape for packing (a sharded one looks empty)
            p.data = torch.empty(1, dtype=p.dtype).expand(old.shape("param", name))
        frozen = [
            n for c in self.chunks.values() if c.kind == "param" and c.frozen for n in c.records
        ]
        given = {"chunk_numel": chunk_numel, "frozen_chunk_numel": frozen_chunk_numel}
        fitted = {k: v for k, v in given.items() if v is not None}
        if fitted:
            self.config = dataclasses.replace(self.config, **fitted)
        self.chunks = {}
        self.views.clear()
        self.groups, self._spill = {}, {}
        _, new = self._pack(params.items(), order, frozen)
        # tiers chosen in the order register and add_parallel (of each kind in turn) choose them,
        # with the ids they give; the payloads then come chunk by chunk as the old ones go
        home = TierName(self.config.home)
        for c in new:
            self._placement.reserve_new(c, home)
        trainable = [c for c in new if not c.frozen]
        for kind, dtype in kinds.items():
            for c in trainable:
                self._new_twin(c, kind, dtype, spill[kind])
        for c in new:
            self._fill(c, {n: old.value("param", n) for n in c.records})
            self.views.bind(c)
            old.taken("param", list(c.records))
            for kind, twin in self.groups[c.chunk_id].twins.items():
                self._fill(twin, {n: old.value(kind, n) for n in c.records})
                old.taken(kind, list(c.records))
        self._bind_policy()
        self._spill = spill
        return new
