"""``shard_map``: where every element of a tensor-parallel shard lives in the unsharded model.

For each parameter of a model that ``parallelize`` shards, the map gives the unsharded name and
shape and the *pieces* of this rank's shard: a box (offsets and sizes per dim) of the local
tensor paired with the box of the unsharded tensor it holds. Checkpoints written through it are
independent of the layout: any other layout (or one process) reads the boxes it needs.

[Note: shard pieces] As in [Note: index model], the plan is applied to a float64 copy of the
unsharded model whose elements hold their global indices, so the map is read off the tp layers'
own sharding rules and cannot drift from them (every mode, 1d to 3d, is handled the same way).
Most shards are one box (a row or column block); a fused projection interleaved per rank
([Note: fused projections]) is one box per fused part: rank ``r`` of ``p`` holds rows
``[k*C + r*C/p, k*C + (r+1)*C/p)`` of GPT's ``qkv`` for ``k`` = q, k, v. A grid layer may store its
weight transposed (``(in, out)``): each local dim is matched to the unsharded dim it runs along
first (``Piece.dims``). Pieces are found by
trying the whole shard as a box, else splitting it along its first dim into maximal runs that
are boxes (and the runs' slabs along the next dim, recursively). A sharded parameter without an
unsharded counterpart (index 0: the frozen zero bias of a bias-free grid LayerNorm) has no
pieces.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn

from colossal_contracts import ConfigError
from colossal_parallel import ProcessMesh

from ._parallelize import parallelize
from .gpt.config import GPTConfig
from .gpt.model import GPT
from .palm.config import PaLMConfig
from .palm.model import PaLM

__all__ = ["Box", "Piece", "ShardMap", "flat_range_boxes", "shard_map"]


@dataclass(frozen=True)
class Box:
    """An axis-aligned block of a tensor: ``t[o0:o0+s0, o1:o1+s1, ...]``.

    Attributes:
        offsets: first index along every dim.
        sizes: extent along every dim (same length as ``offsets``).
    """

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.sizes)

    def slices(self, origin: tuple[int, ...] | None = None) -> tuple[slice, ...]:
        """Index of this box in a tensor whose element ``[0, ...]`` is at ``origin``."""
        origin = origin or (0,) * len(self.offsets)
        return tuple(
            slice(o - a, o - a + s)
            for o, a, s in zip(self.offsets, origin, self.sizes, strict=True)
        )

    def intersect(self, other: Box) -> Box | None:
        """The common block, or None when they do not overlap."""
        lo = [max(a, b) for a, b in zip(self.offsets, other.offsets, strict=True)]
        hi = [
            min(a + s, b + t)
            for a, s, b, t in zip(self.offsets, self.sizes, other.offsets, other.sizes, strict=True)
        ]
        if any(h <= low for low, h in zip(lo, hi, strict=True)):
            return None
        return Box(tuple(lo), tuple(h - low for low, h in zip(lo, hi, strict=True)))

    def subtract(self, other: Box) -> list[Box]:
        """Disjoint boxes covering this one minus ``other`` (at most two per dim)."""
        inter = self.intersect(other)
        if inter is None:
            return [self]
        out: list[Box] = []
        offs, sizes = list(self.offsets), list(self.sizes)

        def box(d: int, start: int, size: int) -> Box:
            return Box((*offs[:d], start, *offs[d + 1 :]), (*sizes[:d], size, *sizes[d + 1 :]))

        for d in range(len(offs)):
            lo, hi = inter.offsets[d], inter.offsets[d] + inter.sizes[d]
            if lo > offs[d]:  # the part before the intersection along d
                out.append(box(d, offs[d], lo - offs[d]))
            if hi < offs[d] + sizes[d]:  # the part after it
                out.append(box(d, hi, offs[d] + sizes[d] - hi))
            offs[d], sizes[d] = lo, hi - lo  # narrow d to the intersection, go on inward
        return out


@dataclass(frozen=True)
class Piece:
    """A block of a local shard and the block of the unsharded tensor it holds.

    Attributes:
        local: the block of the local tensor.
        offsets: where it starts in the unsharded tensor.
        dims: local dim ``d`` runs along unsharded dim ``dims[d]`` (a grid layer that stores
            its weight transposed has ``(1, 0)``); the sizes are ``local.sizes`` permuted so.
    """

    local: Box
    offsets: tuple[int, ...]
    dims: tuple[int, ...] | None = None  # None: the identity

    def _dims(self) -> tuple[int, ...]:
        return self.dims if self.dims is not None else tuple(range(len(self.offsets)))

    def to_global(self, box: Box) -> Box:
        """``box`` (inside ``local``) in the unsharded tensor's coordinates."""
        offs, sizes = list(self.offsets), [0] * len(self.offsets)
        for d, g in enumerate(self._dims()):
            offs[g] += box.offsets[d] - self.local.offsets[d]
            sizes[g] = box.sizes[d]
        return Box(tuple(offs), tuple(sizes))

    def global_view(self, block: torch.Tensor) -> torch.Tensor:
        """A local block (local dim order) as a view in the unsharded tensor's dim order."""
        dims = self._dims()
        return block.permute([dims.index(g) for g in range(len(dims))])

    def local_view(self, block: torch.Tensor) -> torch.Tensor:
        """A block in the unsharded tensor's dim order as a view in the local dim order."""
        return block.permute(self._dims())


@dataclass(frozen=True)
class ShardMap:
    """Where one local parameter's elements live (see [Note: shard pieces]).

    Attributes:
        name: the parameter's name in the unsharded model.
        shape: its unsharded shape.
        pieces: disjoint blocks covering the local tensor (empty: no unsharded counterpart).
    """

    name: str
    shape: tuple[int, ...]
    pieces: tuple[Piece, ...]

    @staticmethod
    def whole(name: str, shape: tuple[int, ...]) -> ShardMap:
        """The map of an unsharded parameter: one piece, the whole tensor."""
        zero = (0,) * len(shape)
        return ShardMap(name, tuple(shape), (Piece(Box(zero, tuple(shape)), zero),))


def flat_range_boxes(shape: tuple[int, ...], lo: int, hi: int) -> list[Box]:
    """Elements ``[lo, hi)`` of a C-contiguous tensor of ``shape`` as disjoint boxes, each a
    contiguous run of the flat tensor, in flat order (at most ``2 * ndim - 1`` boxes)."""
    if lo >= hi:
        return []
    if len(shape) == 0:
        return [Box((), ())]
    if len(shape) == 1:
        return [Box((lo,), (hi - lo,))]
    inner, rest = math.prod(shape[1:]), (0,) * (len(shape) - 1)
    first, last = lo // inner, (hi - 1) // inner
    if first == last and (lo % inner or hi % inner):  # inside one slab along dim 0
        return [
            _lift(b, first) for b in flat_range_boxes(shape[1:], lo % inner, hi - first * inner)
        ]
    out: list[Box] = []
    a, b = -(-lo // inner), hi // inner  # the whole slabs [a, b)
    if lo % inner:
        out += [_lift(x, first) for x in flat_range_boxes(shape[1:], lo % inner, inner)]
    if b > a:
        out.append(Box((a, *rest), (b - a, *shape[1:])))
    if hi % inner:
        out += [_lift(x, last) for x in flat_range_boxes(shape[1:], 0, hi % inner)]
    return out


def _lift(box: Box, index: int) -> Box:
    return Box((index, *box.offsets), (1, *box.sizes))


_MODELS: dict[type, type[nn.Module]] = {GPTConfig: GPT, PaLMConfig: PaLM}


@torch.no_grad()
def shard_map(model: nn.Module, mesh: ProcessMesh | None) -> dict[str, ShardMap]:
    """Parameter name in ``parallelize(model, mesh)`` (a tp layer may rename it) -> ``ShardMap``
    of the shard this rank holds there (with the unsharded name), for every parameter of a ``GPT`` or ``PaLM`` (or one of their pipeline stages: any
    module with their ``config``). ``mesh`` None or without tensor parallelism: every parameter
    whole. Local computation (no collective); builds a float64 index copy of the unsharded
    model (see [Note: shard pieces]): a setup-time cost, for checkpoints, not every step."""
    config = getattr(model, "config", None)
    cls = _MODELS.get(type(config))
    if cls is None:
        raise ConfigError(
            f"shard_map knows GPT and PaLM (and their stages), got {type(model).__name__}"
        )
    index = cls(config)
    if mesh is None or mesh.size("tp") == 1:
        return {n: ShardMap.whole(n, tuple(p.shape)) for n, p in index.named_parameters()}
    index = index.to(torch.float64)
    shapes: dict[str, tuple[int, ...]] = {}
    total = 1  # index 0 marks "no unsharded counterpart"
    for name, p in index.named_parameters():
        p.copy_(torch.arange(total, total + p.numel(), dtype=torch.float64).view_as(p))
        shapes[name] = tuple(p.shape)
        total += p.numel()
    starts = {n: s for n, s in zip(shapes, _cumulative(shapes.values()), strict=True)}
    parallelize(index, mesh, mesh.config.tp_mode)
    out = {}
    for name, local in index.named_parameters():
        flat = local.detach().reshape(-1).to(torch.long)
        if flat.numel() == 0 or int(flat.max()) == 0:
            out[name] = ShardMap(name, shapes.get(name, tuple(local.shape)), ())
            continue
        owner = _owner(int(flat[0]), starts, shapes)
        shape = shapes[owner]
        if len(shape) != local.dim():
            raise ConfigError(
                f"shard_map: the shard of {owner!r} has {local.dim()} dims, the parameter "
                f"{len(shape)}; a tp layer that reshapes its weight needs its own rule here"
            )
        coords = _unravel(flat - starts[owner], shape).view(*local.shape, len(shape))
        dims = _dim_order(coords)
        found = _pieces(coords[..., list(dims)], (0,) * len(shape))  # in dims' order
        ident = dims == tuple(range(len(dims)))
        pieces = tuple(
            Piece(p.local, _unpermute(p.offsets, dims), None if ident else dims) for p in found
        )
        if sum(p.local.numel for p in pieces) != local.numel() or not bool(
            (flat >= starts[owner]).all() & (flat < starts[owner] + math.prod(shape)).all()
        ):
            raise ConfigError(f"shard_map: the shard {name!r} mixes several parameters")
        out[name] = ShardMap(owner, shape, pieces)
    return out


def _cumulative(shapes: Iterable[tuple[int, ...]]) -> list[int]:
    out, total = [], 1
    for s in shapes:
        out.append(total)
        total += math.prod(s)
    return out


def _owner(first: int, starts: dict[str, int], shapes: dict[str, tuple[int, ...]]) -> str:
    for n, s in starts.items():
        if s <= first < s + math.prod(shapes[n]):
            return n
    raise ConfigError(f"shard_map: index {first} belongs to no parameter")


def _unravel(flat: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    cols, rest = [], flat
    for size in reversed(shape):
        cols.append(rest % size)
        rest = rest // size
    return torch.stack(list(reversed(cols)), dim=-1)  # (N, ndim)


def _dim_order(coords: torch.Tensor) -> tuple[int, ...]:
    """Which unsharded dim each local dim runs along, read from each dim's first step."""
    nd = coords.shape[-1]
    found: list[int | None] = []
    for d in range(nd):
        if coords.shape[d] < 2:
            found.append(None)
            continue
        step = coords.narrow(d, 1, 1).reshape(-1, nd)[0] - coords.reshape(-1, nd)[0]
        moved = [g for g in range(nd) if int(step[g]) != 0]
        found.append(moved[0] if len(moved) == 1 else None)
    rest = [g for g in range(nd) if g not in found]
    dims = [g if g is not None else rest.pop(0) if rest else -1 for g in found]
    if sorted(dims) != list(range(nd)):
        return tuple(range(nd))
    return tuple(dims)


def _unpermute(offsets: tuple[int, ...], dims: tuple[int, ...]) -> tuple[int, ...]:
    out = [0] * len(dims)
    for d, g in enumerate(dims):
        out[g] = offsets[d]
    return tuple(out)


def _box_offsets(coords: torch.Tensor) -> tuple[int, ...] | None:
    """Offsets when ``coords`` (local shape + (ndim,)) is one box of the global tensor."""
    nd = coords.shape[-1]
    local = coords.shape[:-1]
    first = coords.reshape(-1, nd)[0]
    for d in range(nd):
        shape = [1] * nd
        shape[d] = local[d]
        want = first[d] + torch.arange(local[d]).view(shape)
        if not bool((coords[..., d] == want).all()):
            return None
    return tuple(int(v) for v in first)


def _runs(coords: torch.Tensor, dim: int) -> list[tuple[int, int, tuple[int, ...] | None]]:
    """Maximal runs ``(first, length, offsets or None)`` along ``dim`` that are boxes (a run of
    one slab that is no box has offsets None): double the run, then bisect."""
    n, out, i = coords.shape[dim], [], 0
    while i < n:
        good, step = 1, 1
        while i + good < n:
            trial = min(good + step, n - i)
            if _box_offsets(coords.narrow(dim, i, trial)) is None:
                break
            good, step = trial, step * 2
        hi = min(good + step, n - i)
        while hi - good > 1:
            mid = (good + hi) // 2
            if _box_offsets(coords.narrow(dim, i, mid)) is None:
                hi = mid
            else:
                good = mid
        out.append((i, good, _box_offsets(coords.narrow(dim, i, good))))
        i += good
    return out


def _pieces(coords: torch.Tensor, start: tuple[int, ...]) -> list[Piece]:
    """Pieces of the local block ``coords`` (which starts at ``start`` in the local tensor):
    the block itself when it is a box, else its runs along the dim that cuts it into the
    fewest boxes (a run that is no box is cut further along the other dims)."""
    local = tuple(coords.shape[:-1])
    off = _box_offsets(coords)
    if off is not None:
        return [Piece(Box(start, local), off)]
    cuts = {d: _runs(coords, d) for d in range(len(local)) if local[d] > 1}
    whole = [d for d, runs in cuts.items() if all(r[2] is not None for r in runs)]
    dim = min(whole, key=lambda d: len(cuts[d])) if whole else min(cuts)
    out: list[Piece] = []
    for i, length, offsets in cuts[dim]:
        at = tuple(s + (i if d == dim else 0) for d, s in enumerate(start))
        sub = coords.narrow(dim, i, length)
        if offsets is None:
            out += _pieces(sub, at)
        else:
            out.append(Piece(Box(at, tuple(sub.shape[:-1])), offsets))
    return out
