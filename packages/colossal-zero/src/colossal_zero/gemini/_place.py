"""Putting a module into chunk memory: its parameters cast to the compute dtype and registered
into chunks (lazy ones materialized one at a time, [Note: lazy init] in ``_lazy.py``), the fp32
masters filled from the original values (or fp32 gradient chunks added, in fp32), and its buffers
moved to the compute device. ``GeminiRuntime`` does this once, as it is built."""

from __future__ import annotations

from functools import partial

import torch
import torch.distributed as dist
from torch import nn

from colossal_chunk import ChunkManager, ManagerHooks
from colossal_contracts import ConfigError, PlacementPolicy, TierName

from .._lazy import LazyInit, LazyValues
from ._config import GeminiConfig
from ._setup import build_manager

__all__ = ["place_module"]


def place_module(
    module: nn.Module,
    named: list[tuple[str, nn.Parameter]],
    config: GeminiConfig,
    group: dist.ProcessGroup | None,
    hooks: ManagerHooks,
    lazy: LazyInit | None,
) -> tuple[ChunkManager, PlacementPolicy]:
    """The chunk manager holding ``module``'s parameters ``named`` (``named_parameters()``),
    and its placement policy; ``ConfigError`` for a parameter that is not floating-point."""
    precision = config.precision_spec
    params = dict(named)
    lazy_values = LazyValues(named, lazy)  # meta parameters: [Note: lazy init]
    originals = {n: p.data for n, p in named if not p.is_meta}
    dtype = precision.param_dtype
    for n, p in named:
        if not p.is_floating_point():
            raise ConfigError(
                f"parameter {n!r} is {p.dtype}; Gemini manages floating-point parameters "
                "only: make it a buffer instead"
            )
        p.data = p.data.to(dtype)
    lazy_values.swap_out()
    manager, policy = build_manager(named, config, group, hooks)
    frozen = [n for n, p in named if not p.requires_grad]  # [Note: frozen chunks]
    fill = lazy_values.fill if lazy_values else None
    manager.register(named, materialize=fill, frozen=frozen)
    if precision.master:  # written once, as each is made (colossal-chunk's [Note: twins
        # filled once]): the values before the cast, lazy ones materialized again
        values = partial(_original, originals, lazy_values, params)
        manager.add_parallel("master", precision.state_dtype, values=values)
        del values
    else:
        manager.add_parallel("grad", precision.state_dtype)  # float64 under fp64
    del originals
    dev = manager.books.tiers[TierName.ACCELERATOR].device
    for buf_owner in module.modules():
        for bname, buf in buf_owner.named_buffers(recurse=False):
            if buf.is_meta:
                buf = lazy_values.buffer(buf)
            setattr(buf_owner, bname, buf.to(dev))
    return manager, policy


def _original(
    originals: dict[str, torch.Tensor],
    lazy_values: LazyValues,
    params: dict[str, nn.Parameter],
    name: str,
) -> torch.Tensor:
    """Parameter ``name``'s value before the cast to the compute dtype (a lazy one materialized
    again, bit-identical to its first materialization: [Note: lazy init])."""
    value = originals.get(name)
    return lazy_values.original(params[name]) if value is None else value
