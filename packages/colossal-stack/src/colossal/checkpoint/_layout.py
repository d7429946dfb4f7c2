"""Layout-independent sharded checkpoints: every rank writes what it alone holds, any layout
(or one process) reads exactly the blocks it needs.

[Note: layout checkpoint] A checkpoint directory holds ``layout-<rank>-of-<world>.safetensors``
files and ``layout_index.json``. The index names, for every parameter of the unsharded model
(its original name, e.g. ``blocks.0.attn.qkv.weight``), its full shape and, for each kind of
tensor — ``param`` (fp32 values: ZeRO's masters where it keeps them), ``exp_avg`` and
``exp_avg_sq`` (Adam's moments, in the parameter's unsharded layout) — the blocks that make it
up: ``[file, key, offsets, sizes]`` (offsets and sizes per dim of the unsharded tensor). Adam's
step counters, hyperparameters (and fp16's loss scale) are in the index itself.

What a rank holds is found in two steps: ``colossal_models.sharding.shard_map`` gives the pieces of each
tensor-parallel shard in the unsharded tensor ([Note: shard pieces]), and the part of the shard
the optimizer keeps here (whole, or ZeRO-1/2's flat range over ``dp``) is cut into boxes
(``flat_range_boxes``) and intersected with them. Blocks held on several ranks (replicated over
``dp``, ``sp`` or a tp axis, the tied embedding on the first and last stage) are written once:
every rank learns every rank's blocks (metadata only), and a rank writes only what lower ranks
do not hold. The blocks of one tensor in the index are therefore disjoint and cover it. Loading
intersects each block a rank needs with the saved ones and reads only those slices
(``safe_open(...).get_slice``), so neither side ever holds an unsharded tensor. The index is
proved whole before any value is read ([Note: whole or not at all] in colossal-zero).

[Note: parameters without pieces] A grid tp layer (2D, 2.5D, 3D) of a bias-free model holds
a parameter the unsharded model lacks: the frozen zero bias of ``GridLayerNorm`` (its shard map
has no pieces, [Note: shard pieces] in colossal-models). It is neither written nor read, under
every plugin (a load leaves its zeros). Gemini's chunk shards list every parameter they hold,
so they are filtered as the hybrid plugin's parameters are; before, such a bias reached the
index under its local shape with no blocks, and no layout could load the checkpoint. A writer
whose blocks do not cover a tensor refuses before any file is written (``_check_whole``).

[Note: LoRA layout checkpoint] A ``peft`` model (LoRA under 1d tp, ``colossal.lora``'s
[Note: LoRA under tp]) is written under the unsharded peft model's names and shapes
(``lora_shard_maps``): its adapters with their Adam state, and, with ``frozen_values``, its
frozen base weights' values (no state). Without them (a LoRA run's checkpoints) the index's
``frozen_omitted`` names the base weights left out, as colossal-zero's [Note: omitted frozen
values]: a load keeps the model's own (rebuilt from its source, checked against the run's base
fingerprint) and the exports rebuild it the same way. ``rename`` writes (and reads) parameters
under other names: a Hugging Face model's adapters trained as our GPT or PaLM keep their
Hugging Face names ([Note: Hugging Face LoRA under tp]); such a base is never written.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from torch import nn

from colossal_contracts import CheckpointError
from colossal_models.sharding import Box, ShardMap, flat_range_boxes, shard_map
from colossal_parallel import ProcessMesh
from colossal_zero import GeminiModule, GeminiOptimizer, LowLevelZeroOptimizer

from ..lora._tp import is_peft_model, lora_shard_maps
from ._layout_gemini import gemini_shards, shard_map_of
from ._layout_read import (
    KINDS,
    LAYOUT_FORMAT,
    LAYOUT_INDEX,
    iter_full_tensors,
    layout_index_fault,
    read_layout_index,
)

__all__ = [
    "LAYOUT_FORMAT",
    "LAYOUT_INDEX",
    "iter_full_tensors",
    "read_layout_index",
    "save_layout",
]

_HYPER = ("lr", "betas", "eps", "weight_decay")


@dataclass
class _Held:
    """One parameter as this rank holds it.

    Attributes:
        smap: where the local shard's elements live in the unsharded tensor.
        shape: the local shard's shape.
        flats: kind -> (1-D view of the elements held, first, end) in the shard's flat order.
        step: Adam's step count (None: never stepped).
        set_step: stores a loaded step count where the optimizer keeps it.
    """

    smap: ShardMap
    shape: tuple[int, ...]
    flats: dict[str, tuple[torch.Tensor, int, int]]
    step: float | None
    set_step: Callable[[float], None]


def _regions(held: _Held, kind: str) -> Iterator[tuple[Box, torch.Tensor]]:
    """(block of the unsharded tensor, view of the elements held here in its dim order)."""
    flat, lo, hi = held.flats[kind]
    strides = [math.prod(held.shape[d + 1 :]) for d in range(len(held.shape))]
    for fb in flat_range_boxes(held.shape, lo, hi):
        start = sum(o * s for o, s in zip(fb.offsets, strides, strict=True)) - lo
        block = flat[start : start + fb.numel].view(fb.sizes)  # contiguous run of the flat range
        for piece in held.smap.pieces:
            inter = fb.intersect(piece.local)
            if inter is not None:
                yield piece.to_global(inter), piece.global_view(block[inter.slices(fb.offsets)])


def _base(model: nn.Module) -> nn.Module:
    """The module that carries the model's ``config``: a pipelined model's first chunk (its
    parameters are named ``chunks.<i>.<name>``), Gemini's wrapped module, else the model."""
    if isinstance(model, GeminiModule):
        return model.module
    return model.chunks[0] if hasattr(model, "chunks") and not hasattr(model, "config") else model


def _held(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    mesh: ProcessMesh | None,
    *,
    fresh: bool,
    frozen: bool = True,
    rename: Mapping[str, str] | None = None,
) -> list[_Held]:
    """What this rank holds of every trainable parameter (with ``frozen``: and of a ``peft``
    model's base), named through ``rename``. ``fresh``: create missing Adam state (zeros)."""
    base = _base(model)
    lora = is_peft_model(base)  # [Note: LoRA layout checkpoint]
    maps = lora_shard_maps(base, mesh) if lora else None
    maps = shard_map(base, mesh) if maps is None and hasattr(base, "config") else maps
    piped = base is not model
    rename = rename or {}

    def smap(name: str, p: torch.Tensor) -> ShardMap:
        if maps is None:
            m = ShardMap.whole(name, tuple(p.shape))
        else:
            m = maps[name.split(".", 2)[2] if piped else name]
        return dataclasses.replace(m, name=rename[m.name]) if m.name in rename else m

    if isinstance(model, GeminiModule):  # chunk shards: see _layout_gemini
        gopt = optimizer if isinstance(optimizer, GeminiOptimizer) else None
        shards = [(shard_map_of(maps, g.name, g.shape), g) for g in gemini_shards(model, gopt)]
        return [  # [Note: parameters without pieces]
            _Held(m, g.shape, g.flats, g.step, g.set_step) for m, g in shards if m.pieces
        ]
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    frozen = _held_frozen(model, smap) if lora and frozen else []
    if isinstance(optimizer, LowLevelZeroOptimizer):
        return _held_zero(optimizer, {n: smap(n, p) for n, p in named}) + frozen
    out = []
    for name, p in named:
        m = smap(name, p)
        if not m.pieces:
            continue
        flats = {"param": (p.data.view(-1), 0, p.numel())}
        st = optimizer.state.get(p) if optimizer is not None else None
        if optimizer is not None and fresh and not st:
            st = optimizer.state[p] = {
                "step": torch.zeros((), dtype=torch.float32),
                "exp_avg": torch.zeros_like(p, memory_format=torch.contiguous_format),
                "exp_avg_sq": torch.zeros_like(p, memory_format=torch.contiguous_format),
            }
        if st:
            for kind in ("exp_avg", "exp_avg_sq"):
                flats[kind] = (st[kind].view(-1), 0, p.numel())

        def set_step(v: float, st: dict | None = st) -> None:
            if st is not None:
                st["step"] = torch.tensor(v, dtype=torch.float32)

        step = float(st["step"]) if st else None
        out.append(_Held(m, tuple(p.shape), flats, step, set_step))
    return out + frozen


def _held_frozen(model: nn.Module, smap: Callable[[str, torch.Tensor], ShardMap]) -> list[_Held]:
    """The frozen parameters of a ``peft`` model (its base): values only, no optimizer state
    ([Note: LoRA layout checkpoint])."""
    out = []
    for name, p in model.named_parameters():
        m = smap(name, p)
        if p.requires_grad or not m.pieces:
            continue
        flats = {"param": (p.data.view(-1), 0, p.numel())}
        out.append(_Held(m, tuple(p.shape), flats, None, lambda v: None))
    return out


def _held_zero(opt: LowLevelZeroOptimizer, maps: dict[str, ShardMap]) -> list[_Held]:
    out = []
    for b in opt.buckets:
        for name, p in b.params.items():
            part = b.fp32.shard_view(name)
            m = maps[name]
            if part is None or not m.pieces:
                continue
            _, lo, hi = part
            flats = {"param": part}
            for kind, chunk in (("exp_avg", b.exp_avg), ("exp_avg_sq", b.exp_avg_sq)):
                view = chunk.shard_view(name)
                assert view is not None  # the states' buckets have the fp32 one's layout
                flats[kind] = (view[0], lo, hi)

            def set_step(v: float, name: str = name) -> None:
                opt.steps[name] = torch.tensor(v, dtype=torch.float32)

            step = float(opt.steps[name]) if name in opt.steps else None
            out.append(_Held(m, tuple(p.shape), flats, step, set_step))
    return out


def _model_info(model: nn.Module) -> dict[str, Any] | None:
    config = getattr(_base(model), "config", None)
    if not dataclasses.is_dataclass(config) or isinstance(config, type):
        return None
    kind = type(config).__name__.removesuffix("Config")  # "GPT", "PaLM"
    return {"class": kind, "config": dataclasses.asdict(config)}


def _world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


@torch.no_grad()
def save_layout(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    mesh: ProcessMesh | None,
    directory: Path,
    *,
    layout: str,
    frozen_values: bool = True,
    rename: Mapping[str, str] | None = None,
) -> None:
    """Write this rank's blocks into ``directory`` (rank 0 also the index); see [Note: layout
    checkpoint]; ``frozen_values`` and ``rename``: [Note: LoRA layout checkpoint]. Collective
    over the whole world when one exists."""
    rank, world = _world()
    frozen_values = frozen_values and not rename
    held = _held(model, optimizer, mesh, fresh=False, frozen=frozen_values, rename=rename)
    lora = not frozen_values and is_peft_model(_base(model))  # the frozen base left out:
    omitted = sorted(n for n, p in model.named_parameters() if lora and not p.requires_grad)
    mine = [
        (kind, h.smap.name, box, view)
        for h in held
        for kind in KINDS
        if kind in h.flats
        for box, view in _regions(h, kind)
    ]
    meta = {
        "blocks": [(k, n, b.offsets, b.sizes) for k, n, b, _ in mine],
        "shapes": {h.smap.name: list(h.smap.shape) for h in held},
        "steps": {h.smap.name: h.step for h in held if h.step is not None},
    }
    every: list[Any] = [meta]
    if world > 1:
        every = [None] * world
        dist.all_gather_object(every, meta)
    writes = _assign(every)  # (rank, kind, name, box) of every block to write, disjoint
    file = f"layout-{rank:05d}-of-{world:05d}.safetensors"
    entries: dict[str, dict[str, list]] = {k: {} for k in KINDS}
    mine_to_write: list[tuple[str, int, Box]] = []
    for counter, (r, i, box) in enumerate(writes):
        kind, name = every[r]["blocks"][i][:2]
        fname = f"layout-{r:05d}-of-{world:05d}.safetensors"
        key = f"{kind}/{name}/{counter}"
        entries[kind].setdefault(name, []).append([fname, key, list(box.offsets), list(box.sizes)])
        if r == rank:
            mine_to_write.append((key, i, box))
    shapes: dict[str, list[int]] = {}
    steps: dict[str, float] = {}
    for m in every:
        shapes.update(m["shapes"])
        steps.update(m["steps"])
    _check_whole(shapes, entries, steps, layout)  # every rank alike, before any file
    tensors: dict[str, torch.Tensor] = {}
    for key, i, box in mine_to_write:
        _, _, src, view = mine[i]
        data = view[box.slices(src.offsets)]
        wide = torch.promote_types(data.dtype, torch.float32)  # fp32; float64 under fp64
        tensors[key] = data.detach().to("cpu", wide).contiguous().clone()
    if tensors:
        save_file(tensors, str(Path(directory) / file))
    if rank == 0:
        group = optimizer.param_groups[0] if optimizer is not None else {}
        scaler = _scaler(optimizer)
        index = {
            "format": LAYOUT_FORMAT,
            "layout": layout,
            "world_size": world,
            "model": None if rename else _model_info(model),
            "params": {n: {"shape": shapes[n]} for n in sorted(shapes)},
            "tensors": entries,
            "steps": steps,
            "optimizer": {k: group[k] for k in _HYPER if k in group} if optimizer else None,
            "scaler": scaler.state_dict() if scaler is not None else None,
            **({"frozen_omitted": omitted} if omitted else {}),
        }
        (Path(directory) / LAYOUT_INDEX).write_text(json.dumps(index, indent=1))


def _check_whole(
    shapes: dict[str, list[int]], entries: dict[str, dict[str, list]], steps: dict, layout: str
) -> None:
    """``CheckpointError`` when the blocks the ranks hold leave an element of some tensor
    unwritten (or write one twice): the same on every rank, so all refuse together and no
    checkpoint that cannot load is written ([Note: whole or not at all])."""
    index = {"params": {n: {"shape": s} for n, s in shapes.items()}, "tensors": entries}
    fault = layout_index_fault(index | {"steps": steps})
    if fault:
        raise CheckpointError(
            f"save_layout: {fault} on the layout {layout!r}: the ranks' shards do not make up "
            "the unsharded tensor, so this checkpoint could not be loaded; nothing was written. "
            "The layout's shard maps (colossal_models.sharding.shard_map) miss a rule for it"
        )


def _assign(every: list[dict]) -> list[tuple[int, int, Box]]:
    """(rank, block index, part) to write: each rank writes the parts of its blocks no lower
    rank holds, so the written parts of one tensor are disjoint. The same on every rank."""
    covered: dict[tuple[str, str], list[Box]] = {}
    out = []
    for r, meta in enumerate(every):
        for i, (kind, name, offsets, sizes) in enumerate(meta["blocks"]):
            parts = [Box(tuple(offsets), tuple(sizes))]
            have = covered.setdefault((kind, name), [])
            for c in have:
                parts = [q for p in parts for q in p.subtract(c)]
            have.extend(parts)
            out += [(r, i, p) for p in parts]
    return out


def _scaler(optimizer: torch.optim.Optimizer | None) -> Any:
    """The loss scaler of a sharded optimizer (ZeRO-1/2 or Gemini under fp16); None without."""
    if isinstance(optimizer, LowLevelZeroOptimizer | GeminiOptimizer):
        return optimizer.scaler
    return None
