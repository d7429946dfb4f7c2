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

``ChunkManager`` inherits these methods; they fill its chunks, its name books and its placement.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

import torch
import torch.distributed as dist

from colossal_contracts import ConfigError, PlacementPolicy, TierName

from ._chunk import Chunk
from ._config import ChunkConfig
from ._group import ChunkGroup
from ._host_memory import host_empty
from ._pending import InFlightCount
from ._placement import Placement
from ._tier import Tier
from ._views import ParamViews
from .policies._base import ChunkSummary, PolicyContext

__all__ = ["ManagerRegistry"]

ACC = TierName.ACCELERATOR


class ManagerRegistry:
    """``register`` and ``add_parallel``; see the module docstring."""

    config: ChunkConfig  # the manager's
    policy: PlacementPolicy  # the manager's
    group: dist.ProcessGroup | None  # the manager's
    chunks: dict[int, Chunk]  # every chunk by id (the manager's)
    tiers: dict[TierName, Tier]  # the manager's (a property there)
    chunk_numel: int  # the manager's (a property there)
    frozen_chunk_numel: int  # the manager's (a property there)
    _placement: Placement  # the manager's
    _views: ParamViews  # the manager's: registered parameters by name, their chunks
    groups: dict[int, ChunkGroup]  # the manager's: param chunk id -> its record
    _spill: dict[str, int | None]  # the manager's: twin kind -> its add_parallel spill_reserve
    in_flight: InFlightCount  # the manager's: its chunks count their collectives there
    _steady: bool  # [Note: resident fast path]: the manager's
    _bind: Callable[[Chunk], None]  # the manager's: re-points a chunk's parameter views

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
        fresh, new = self._pack(named_params, order, frozen)
        for c in new:
            tensors = {
                n: materialize(fresh[n]) if materialize else fresh[n].data for n in c.records
            }
            self._placement.reserve_new(c, TierName(self.config.home))
            self._fill(c, tensors)
            del tensors  # lazy init: this chunk's values go before the next chunk's are made
            self._bind(c)
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
        self._steady = False
        fresh: dict[str, torch.nn.Parameter] = {}
        for name, p in named_params:
            if self._views.knows(name, p) or any(q is p for q in fresh.values()):
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
                c.flights = self.in_flight
                self.chunks[c.chunk_id] = c
                self.groups[c.chunk_id] = ChunkGroup(c)
                open_chunk[key] = c
                new.append(c)
            c.add(name, p.shape)
            self._views.add(name, p, c.chunk_id)
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
        copy_params: bool = False,
        spill_reserve: int | None = None,
    ) -> list[Chunk]:
        """A chunk of ``dtype`` with the same layout beside every parameter chunk (gradients, fp32
        master weights, optimizer states). Zeros, or with ``copy_params`` the parameters' values
        cast to ``dtype``. They start on ``config.home`` like parameter chunks (spilling to the
        host, then disk; with ``spill_reserve``, then to the compute tier while that many bytes
        of its room stay free, kept there: [Note: kept chunks]). Frozen chunks get none ([Note:
        frozen chunks])."""
        if kind == "param" or kind in self._spill:
            raise ConfigError(f"parallel chunk kind {kind!r} is taken; pick another name")
        self._steady = False
        twins = []
        for cid in [c.chunk_id for c in self.chunks.values() if c.kind == "param" and not c.frozen]:
            src = self.chunks[cid]
            if copy_params:
                vals = {n: self._full_value(src, n) for n in src.records}
            else:
                # fresh mappings read as zeros without taking memory ([Note: host payloads])
                vals = {n: host_empty(r.numel, dtype).view(r.shape) for n, r in src.records.items()}
            twins.append(self._add_twin(src, kind, dtype, vals, spill_reserve))
        self._spill[kind] = spill_reserve
        self._bind_policy()
        return twins

    def _add_twin(
        self,
        src: Chunk,
        kind: str,
        dtype: torch.dtype,
        values: Mapping[str, torch.Tensor],
        spill_reserve: int | None,
    ) -> Chunk:
        """One ``kind`` twin of parameter chunk ``src`` holding ``values`` (full tensors by name),
        placed as ``add_parallel`` places them, on ``src``'s record."""
        twin = self._new_twin(src, kind, dtype, spill_reserve)
        self._fill(twin, values)
        return twin

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
        self.policy.bind(
            PolicyContext(summaries, dict(self._views.chunk_of), self.tiers[ACC].capacity_bytes)
        )
