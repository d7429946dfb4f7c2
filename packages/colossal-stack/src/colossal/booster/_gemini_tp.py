"""Tensor parallelism under Gemini: the mesh ``dp x tp``, the sharded model and its layout.

[Note: Gemini with tp] ``GeminiPlugin(tp_size > 1)`` builds ``ProcessMesh(dp = world / tp, tp,
tp_mode)``, shards the model through its plan (``colossal_models.parallelize``) and applies
Gemini over the ``dp`` group: each rank's chunks hold its tensor-parallel shards, and every chunk
is sharded again over the dp ranks of the same tp coordinate (ZeRO-3 with tensor parallelism).
Gemini agrees on the gradient norm and fp16 overflow over ``dp`` itself, and over the tp sub-axes
through the layout ``describe_sharding`` reads off the plan. Gemini's rank agreement, gathers and
reduce-scatters all run on the dp group, so the tp coordinates never see each other's chunks.

Checkpoints: the layout-independent format (``_layout_gemini``), so any tp size or plugin
resumes them; older ones, one Gemini checkpoint per tp coordinate in ``tp<mode>-<c>-of-<tp>``,
load on the same layout. The consolidated export (bounded shards with a Hugging Face index) streams as the
dp-only one does: Gemini gathers one chunk at a time over dp, and each of its tensors is
assembled over tp on the first rank of global rank 0's tp group alone (``tp_stream_state``,
[Note: streamed tp gather] in colossal-models) and written before the next; the other tp groups
only take part in their dp gathers. No rank holds more than one gathered chunk, one full tensor
and one peer's shard beyond its own shards.

[Note: Gemini with sp] With ring or Ulysses sequence parallelism the mesh is ``(dp, sp)``, or
``(dp, sp, tp)`` with 1D tp (the model is sharded over tp first, then its attention cores are
swapped); ``apply_sequence_parallel`` gives each sp rank its slice of every sequence, and
Gemini's chunks are sharded over ``dp_sp`` (dp and sp flattened, within one tp coordinate):
every rank holds 1/(dp*sp) of its tp shard's model states (ZeRO-3 over dp with sp). Gemini
averages gradients over its group, and the sp ranks' gradients must be summed (each has its
tokens' share of the mean loss), so the loss is multiplied by sp before backward: the sum over
sp, the mean over dp.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from colossal_contracts import ConfigError, ParamSharding
from colossal_models import GPT, PaLM, parallelize
from colossal_models.sharding import (
    ShardMap,
    all_shard_maps,
    describe_sharding,
    original_names,
    stream_full_state,
)
from colossal_parallel import MeshConfig, ProcessMesh, TpMode
from colossal_zero import LazyInit, adam_arguments

from ._groups import GroupMap, rebuilt
from ._lazy_fill import sharding_lazily

__all__ = [
    "check_sp",
    "check_tp_inputs",
    "shard_for_tp",
    "sp_mesh_config",
    "tp_folder",
    "tp_mesh_config",
    "tp_shard_maps",
    "tp_stream_state",
    "world_size",
]


def tp_mesh_config(world_size: int, size: int, mode: TpMode, depth: int, sp: int = 1) -> MeshConfig:
    """``dp = world_size / (size * sp)``; ``ConfigError`` when that does not divide the world."""
    if world_size % size:
        raise ConfigError(
            f"tp_size={size} does not divide the world size {world_size}; launch a multiple of "
            f"{size} ranks or choose a tp_size that divides {world_size}"
        )
    if world_size % (size * sp):
        raise ConfigError(
            f"tp_size * sp_size = {size}*{sp} does not divide the world size {world_size}; "
            f"launch a multiple of {size * sp} ranks or change the sizes"
        )
    cfg = MeshConfig(dp=world_size // (size * sp), sp=sp, tp=size, tp_mode=mode, tp_depth=depth)
    cfg.validate(world_size)
    return cfg


def check_tp_inputs(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """``ConfigError`` unless ``model`` has a tensor-parallel plan and ``optimizer`` is an
    Adam/AdamW (checked before the mesh exists)."""
    if not isinstance(model, GPT | PaLM):
        raise ConfigError(
            f"GeminiPlugin(tp_size > 1) shards GPT and PaLM through their plans, got "
            f"{type(model).__name__}; use tp_size=1 for other models"
        )
    adam_arguments(optimizer, who="Gemini")  # Adam/AdamW without amsgrad or maximize


def shard_for_tp(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    mesh: ProcessMesh,
    group_map: GroupMap | None = None,
    lazy: LazyInit | None = None,
) -> tuple[torch.optim.Optimizer, dict[str, ParamSharding]]:
    """Shard ``model`` (see ``check_tp_inputs``) in place for ``mesh``; the user's optimizer
    rebuilt on the sharded parameters (same class, groups and hyperparameters) and every
    layout. ``group_map``: the groups by name, when taken before the parameters were replaced
    (a lazy model's); None: taken now. ``lazy``: the model's ``LazyInit`` when it is
    still on the meta device: the plan's slices are recorded there, so Gemini fills each rank's
    slices chunk by chunk ([Note: lazy fill])."""
    if group_map is None:  # each sharded parameter keeps its group, by name
        group_map = GroupMap(model, optimizer)
    with sharding_lazily(lazy):
        parallelize(model, mesh)
    sharding = describe_sharding(model, mesh)
    named = original_names(model)  # wrapped key/value projections keep their groups
    groups = group_map.groups((named[n], p) for n, p in model.named_parameters())
    return rebuilt(optimizer, groups), sharding


def tp_folder(path: Path, mesh: ProcessMesh) -> Path:
    """This tp coordinate's Gemini checkpoint folder under ``path``, e.g. ``tp1d-0-of-2`` (see
    [Note: Gemini with tp])."""
    return Path(path) / f"tp{mesh.config.tp_mode}-{mesh.coord('tp')}-of-{mesh.size('tp')}"


def tp_shard_maps(model: nn.Module, mesh: ProcessMesh) -> list[dict[str, ShardMap]]:
    """What every tp peer holds of each parameter of the sharded ``model`` (by tp group rank),
    for the streamed export. Collective over tp; builds an index copy of the unsharded model
    once (as ``describe_sharding`` does), so it is computed when the model is sharded."""
    return all_shard_maps(model, mesh)


def tp_stream_state(
    model: nn.Module,
    tensors: Iterable[tuple[str, torch.Tensor]],
    mesh: ProcessMesh,
    maps: list[dict[str, ShardMap]],
) -> Iterator[tuple[str, torch.Tensor]]:
    """The unsharded state (parameters under the unsharded model's names, then buffers) from
    this rank's tensor-parallel ``tensors`` (Gemini's ``iter_full_state``), yielded on global
    rank 0 alone, one tensor at a time. Collective: over tp in rank 0's tp group, which
    assembles each tensor; every rank iterates to the end (see [Note: Gemini with tp])."""
    writes = 0 in dist.get_process_group_ranks(mesh.group("tp"))
    yield from stream_full_state(model, mesh, tensors, maps, gather=writes)


def check_sp(method: str | None, size: int) -> None:
    """``ConfigError`` unless Gemini's sequence-parallel kind and size go together (each alone
    is ``MeshFields.check_mesh_fields``'; which tp modes they compose with is the capability
    table's: [Note: capability table])."""
    if (method is None) != (size == 1):
        raise ConfigError(
            "sequence_parallel='ring' or 'ulysses' goes with sp_size >= 2, and sp_size > 1 needs "
            f"one of them; got sequence_parallel={method!r}, sp_size={size}"
        )


def sp_mesh_config(world_size: int, sp: int) -> MeshConfig:
    """``dp = world_size / sp``; ``ConfigError`` when ``sp`` does not divide the world."""
    if world_size % sp:
        raise ConfigError(
            f"sp_size={sp} does not divide the world size {world_size}; launch a multiple of "
            f"{sp} ranks or choose an sp_size that divides {world_size}"
        )
    cfg = MeshConfig(dp=world_size // sp, sp=sp)
    cfg.validate(world_size)
    return cfg


def world_size() -> int:
    """The torch.distributed world size (1 when it is not initialised)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
