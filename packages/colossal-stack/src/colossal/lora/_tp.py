"""LoRA under 1D tensor parallelism: a ``peft`` model of our GPT or PaLM sharded with its base.

[Note: LoRA under tp] ``peft`` wraps the *unsharded* model (the adapter folder's names and
shapes are then the plain ones, [Note: where peft wraps]); ``parallelize_lora`` then takes each
LoRA layer's ``base_layer`` back into the model, runs the model's own tp plan on it
(``colossal_models.parallelize``), and shards the adapters alongside their base as the plan
sharded it (read off the base's ``shard_map``, so GPT's per-rank interleaved ``qkv`` rows hold
for ``lora_B`` too):

- column-parallel base (output split): ``lora_B`` keeps the base weight's output rows
  (a ``ColumnParallelLinear`` over the rank dim: its input, ``lora_A``'s r outputs, is
  copied to the tp ranks, so the r-dim gradient is summed over them in backward), ``lora_A``
  is replicated and gets the full gradient on every rank;
- row-parallel base (input split): ``lora_A`` keeps the base weight's input columns (a
  ``RowParallelLinear``: its r-dim partial sums are all-reduced forward), ``lora_B`` is
  replicated and takes the replicated r-dim activation.

So ``B @ A`` is sharded exactly as the base weight, and ``peft``'s forward
(``base(x) + B(A(x)) * scaling``) runs unchanged on the shards. Base weights stay frozen
(``requires_grad=False``): no gradient, no optimizer state. Megatron sequence parallelism,
the grid modes (2d/2.5d/3d) and GQA key/value layers shared over tp ranks have no rule here
(the job refuses them before building, see ``colossal.train._lora_flags``).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
from torch import nn

from colossal_contracts import ConfigError, ParamSharding
from colossal_models import parallelize
from colossal_models.sharding import Box, Piece, ShardMap, describe_sharding, shard_map
from colossal_parallel import ProcessMesh
from colossal_parallel.tp1d import ColumnParallelLinear, RowParallelLinear

from ._apply import import_peft

__all__ = ["is_peft_model", "lora_shard_maps", "parallelize_lora"]


def is_peft_model(model: nn.Module) -> bool:
    """Whether ``model`` is a ``peft.PeftModel`` (False without importing peft: a model built
    by peft has imported it)."""
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


@dataclass(frozen=True)
class _Site:
    """One LoRA layer of the inner model.

    Attributes:
        name: its name in the inner (GPT/PaLM) model, e.g. ``blocks.0.attn.qkv``.
        layer: peft's ``lora.Linear`` (``base_layer``, ``lora_A``, ``lora_B``).
    """

    name: str
    layer: nn.Module


def _inner(model: nn.Module) -> tuple[nn.Module, str]:
    """The GPT/PaLM inside a ``PeftModel`` and the prefix of its names in ``model``."""
    if not is_peft_model(model):
        raise ConfigError(
            f"LoRA under tensor parallelism needs a peft.PeftModel of a GPT or PaLM, got "
            f"{type(model).__name__}; wrap the model with peft.get_peft_model first"
        )
    inner = model.get_base_model()
    for name, module in model.named_modules():
        if module is inner:
            return inner, f"{name}." if name else ""
    raise ConfigError("parallelize_lora: the peft model does not hold its base model")


def _sites(inner: nn.Module) -> list[_Site]:
    lora = import_peft().tuners.lora
    out = []
    for name, m in inner.named_modules():
        if isinstance(m, lora.LoraLayer):
            if not isinstance(m, lora.Linear) or any(m.use_dora.values()):
                raise ConfigError(
                    f"LoRA under tensor parallelism adapts linear layers with plain LoRA; "
                    f"{name} is {type(m).__name__}; target linear layers only (attn, mlp)"
                )
            out.append(_Site(name, m))
    return out


def _set(inner: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, leaf = name.rpartition(".")
    setattr(inner.get_submodule(parent) if parent else inner, leaf, module)


def _runs(smap: ShardMap, dim: int) -> list[tuple[int, int, int]]:
    """(local offset, global offset, length) along ``dim`` of a 1d tp shard's pieces."""
    out = []
    for p in smap.pieces:
        if p.dims not in (None, (0, 1)):
            raise ConfigError(f"LoRA under tp: {smap.name} is stored transposed (a grid mode)")
        out.append((p.local.offsets[dim], p.offsets[dim], p.local.sizes[dim]))
    return out


def _take(full: torch.Tensor, runs: list[tuple[int, int, int]], dim: int) -> torch.Tensor:
    """This rank's rows (``dim`` 0) or columns (``dim`` 1) of ``full``, in local order."""
    size = sum(n for _, _, n in runs)
    shape = list(full.shape)
    shape[dim] = size
    out = full.new_empty(shape)
    for lo, go, n in runs:
        out.narrow(dim, lo, n).copy_(full.narrow(dim, go, n))
    return out


def _shard_adapters(site: _Site, base: nn.Module, smap: ShardMap, mesh: ProcessMesh) -> None:
    """Replace the site's adapters by their shards beside the sharded ``base`` (see [Note:
    LoRA under tp])."""
    layer, kind = site.layer, _kind(base)
    for adapter in list(layer.lora_A.keys()):
        a, b = layer.lora_A[adapter], layer.lora_B[adapter]
        kw = {"bias": False, "dtype": a.weight.dtype, "device": a.weight.device}
        with torch.no_grad():
            if kind == "column":
                new = ColumnParallelLinear(b.in_features, b.out_features, mesh, **kw)
                new.weight.copy_(_take(b.weight, _runs(smap, 0), 0))
                new.weight.requires_grad_(b.weight.requires_grad)
                layer.lora_B[adapter] = new
            else:
                new = RowParallelLinear(a.in_features, a.out_features, mesh, **kw)
                new.weight.copy_(_take(a.weight, _runs(smap, 1), 1))
                new.weight.requires_grad_(a.weight.requires_grad)
                layer.lora_A[adapter] = new
    layer.base_layer = base


def _check_kind(site: _Site, base: nn.Module) -> None:
    """``ConfigError`` when the plan made ``site``'s base a layer without a LoRA rule."""
    kind = _kind(base)
    if kind == "whole" or base.sequence_parallel:
        what = type(base).__name__ if kind == "whole" else "Megatron sequence parallelism"
        raise ConfigError(
            f"LoRA under tensor parallelism: {site.name} is sharded as {what}, which has no "
            "LoRA rule (1d column and row layers have: key/value heads shared over tp ranks do "
            "not); leave it out of --lora-targets or use a layout without it"
        )


def parallelize_lora(model: nn.Module, mesh: ProcessMesh) -> dict[str, ParamSharding]:
    """Shard a ``peft`` model of a GPT or PaLM in place over ``mesh``'s 1d tp axis, adapters
    alongside their base weights ([Note: LoRA under tp]); returns each parameter's
    ``ParamSharding`` by its name in ``model``. Every rank passes the same unsharded model.
    Collective over tp (``describe_sharding``)."""
    inner, prefix = _inner(model)
    sites = _sites(inner)
    for s in sites:  # the plain model: the plan sees the layers it knows
        _set(inner, s.name, s.layer.base_layer)
    trainable = {n for n, p in inner.named_parameters() if p.requires_grad}
    parallelize(inner, mesh)
    for n, p in inner.named_parameters():  # the plan's new parameters keep the base frozen
        p.requires_grad_(n in trainable)
    layout = describe_sharding(inner, mesh)
    maps = shard_map(inner, mesh)
    for s in sites:
        base = inner.get_submodule(s.name)
        _check_kind(s, base)
        _shard_adapters(s, base, maps[f"{s.name}.weight"], mesh)
        _set(inner, s.name, s.layer)
    kinds = {s.name: _kind(s.layer.base_layer) for s in sites}
    return {n: _lora_entry(n[len(prefix) :], layout, kinds) for n, _ in model.named_parameters()}


def _split(name: str) -> tuple[str, str, str]:
    """``(layer, role, rest)`` of an inner name: role "base", "lora_A", "lora_B" or ""."""
    for role in ("base_layer", "lora_A", "lora_B"):
        key = f".{role}."
        if key in name:
            layer, _, rest = name.partition(key)
            return layer, "base" if role == "base_layer" else role, rest
    return name, "", ""


def _lora_entry(
    name: str, layout: dict[str, ParamSharding], kinds: dict[str, str]
) -> ParamSharding:
    """The sharding of ``name`` (an inner name): the plan's for base and other parameters; an
    adapter is split as its base weight where it holds the base's split dim (``lora_B`` of a
    column layer, ``lora_A`` of a row layer), else replicated over the base's axes."""
    layer, role, rest = _split(name)
    if role == "":
        return layout[name]
    if role == "base":
        return layout[f"{layer}.{rest}"]
    base = layout[f"{layer}.weight"]
    if _split_dim(kinds[layer], role) is not None:
        return base
    return ParamSharding((), (*base.split, *base.replicated))


def _split_dim(kind: str, role: str) -> int | None:
    """The dim of ``role``'s adapter weight split over tp beside a ``kind`` base (None: whole)."""
    return {("column", "lora_B"): 0, ("row", "lora_A"): 1}.get((kind, role))


def lora_shard_maps(model: nn.Module, mesh: ProcessMesh | None) -> dict[str, ShardMap]:
    """Name in ``model`` (a ``peft`` model that ``parallelize_lora`` sharded, or an unsharded
    one) -> ``ShardMap`` of this rank's shard under the unsharded peft model's names and shapes
    (what a layout checkpoint writes: [Note: shard pieces] in colossal-models). Local."""
    inner, prefix = _inner(model)
    plain = shard_map(inner, mesh)  # keyed by the plain model's names (from its config)
    kinds = {s.name: _kind(s.layer.base_layer) for s in _sites(inner)}
    out = {}
    for n, p in model.named_parameters():
        layer, role, rest = _split(n[len(prefix) :])
        if role in ("", "base"):
            m = plain[f"{layer}.{rest}" if role else layer]
            out[n] = ShardMap(n, m.shape, m.pieces)
            continue
        shape = tuple(p.shape)
        base = plain[f"{layer}.weight"]
        dim = _split_dim(kinds[layer], role)
        if dim is None:
            out[n] = ShardMap.whole(n, shape)
            continue
        full = list(shape)
        full[dim] = base.shape[dim]
        pieces = []
        for lo, go, size in _runs(base, dim):
            offs, glob, sizes = [0, 0], [0, 0], list(shape)
            offs[dim], glob[dim], sizes[dim] = lo, go, size
            pieces.append(Piece(Box(tuple(offs), tuple(sizes)), tuple(glob)))
        out[n] = ShardMap(n, tuple(full), tuple(pieces))
    return out


def _kind(base: nn.Module) -> str:
    if type(base) is ColumnParallelLinear:
        return "column"
    if type(base) is RowParallelLinear:
        return "row"
    return "whole"
