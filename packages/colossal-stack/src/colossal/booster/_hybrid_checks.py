"""What the hybrid plugin checks of a model and optimizer before any process group, and how it
words its mesh in one line."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from colossal_contracts import ConfigError
from colossal_parallel import MeshConfig
from colossal_parallel.pipeline import SCHEDULES, PipelineSchedule, ScheduleKind
from colossal_zero import adam_arguments

from .._capability import SP_KINDS, long_sequence, megatron_sequence

if TYPE_CHECKING:
    from ._hybrid import HybridParallelPlugin

__all__ = [
    "check_model_and_optimizer",
    "check_settings",
    "check_sizes",
    "describe_mesh",
    "mesh_config",
    "settings",
]

_SP_METHODS = (None, *SP_KINDS[1:])  # "ring+megatron": ring over sp, Megatron over tp


def check_settings(plugin: HybridParallelPlugin) -> None:
    """``ConfigError`` (one line) for a size that is not a positive int or a kind that is not
    known (the mesh fields first, as Gemini checks them: [Note: mesh fields]): checked before
    anything else of the plugin."""
    plugin.check_mesh_fields(_SP_METHODS)
    for k in ("pp_size", "microbatches"):
        v = getattr(plugin, k)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"HybridParallelPlugin.{k} must be a positive int, got {v!r}")
    if plugin.zero_stage == 3:
        raise ConfigError(
            "the hybrid plugin shards up to ZeRO stage 2; for ZeRO-3 with tensor parallelism "
            "use GeminiPlugin(tp_size=...) (--plugin gemini with --tp)"
        )
    if plugin.zero_stage not in (0, 1, 2):
        raise ConfigError(f"zero_stage must be 0, 1 or 2, got {plugin.zero_stage!r}")
    if plugin.schedule not in SCHEDULES:
        raise ConfigError(f"schedule must be one of {SCHEDULES}, got {plugin.schedule!r}")


def check_sizes(plugin: HybridParallelPlugin) -> None:
    """``ConfigError`` for sizes that cannot compose: an ``sp_size`` without ring or Ulysses,
    micro-batches without a pipeline (the tp sizes are ``check_settings``')."""
    if long_sequence(plugin.sequence_parallel) is None and plugin.sp_size != 1:
        raise ConfigError(
            f"sp_size={plugin.sp_size} needs sequence_parallel='ring' or 'ulysses' (Megatron "
            "sequence parallelism uses the tp ranks); set sp_size=1"
        )
    if plugin.pp_size == 1 and plugin.microbatches != 1:
        raise ConfigError("microbatches > 1 needs pp_size > 1 (pipeline micro-batches)")


def settings(plugin: HybridParallelPlugin) -> str:
    """The settings that differ from the defaults, for messages (``tp_size=2, zero_stage=1``)."""
    names = ("tp_size", "tp_mode", "sequence_parallel", "pp_size", "schedule", "zero_stage")
    names += ("precision", "activation_checkpointing")
    d = type(plugin).__dataclass_fields__
    return ", ".join(
        f"{n}={getattr(plugin, n)!r}" for n in names if getattr(plugin, n) != d[n].default
    )


def mesh_config(plugin: HybridParallelPlugin, world_size: int) -> MeshConfig:
    """``HybridParallelPlugin.mesh_config``: ``dp = world / (tp * pp * sp)``."""
    block = plugin.tp_size * plugin.pp_size * plugin.sp
    if world_size % block:
        raise ConfigError(
            f"tp*pp*sp = {plugin.tp_size}*{plugin.pp_size}*{plugin.sp} = {block} does not divide "
            f"the world size {world_size}; launch a multiple of {block} ranks or change the sizes"
        )
    cfg = MeshConfig(
        dp=world_size // block,
        pp=plugin.pp_size,
        tp=plugin.tp_size,
        tp_mode=plugin.tp_mode,
        tp_depth=plugin.tp_depth,
        sp=plugin.sp,
    )
    cfg.validate(world_size)
    return cfg


def check_model_and_optimizer(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    cfg: MeshConfig,
    schedule: tuple[ScheduleKind, int, int],
    *,
    zero_stage: int,
) -> None:
    """``ConfigError`` (one line) unless ``model`` is a GPT or PaLM with at least one block per
    stage, the pipeline ``schedule`` (name, micro-batches, chunks per rank) runs on ``cfg.pp``
    ranks, and ``optimizer`` is Adam/AdamW (under ZeRO: without amsgrad or maximize)."""
    name, microbatches, num_virtual = schedule
    layers = getattr(getattr(model, "config", None), "num_layers", None)
    if layers is None:
        raise ConfigError(f"the hybrid plugin knows GPT and PaLM, got {type(model).__name__}")
    if cfg.pp * num_virtual > layers:
        raise ConfigError(
            f"pp={cfg.pp} x {num_virtual} chunk(s) = {cfg.pp * num_virtual} stages "
            f"for a model of {layers} blocks; use at most {layers} stages"
        )
    if cfg.pp > 1:
        PipelineSchedule(name, microbatches, num_virtual).validate(cfg.pp)
    if zero_stage:  # ZeRO's Adam: no amsgrad or maximize (before any group)
        adam_arguments(optimizer, who=f"the hybrid plugin's ZeRO-{zero_stage}")
    elif not isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW):
        raise ConfigError(
            f"the hybrid plugin trains with Adam or AdamW, got {type(optimizer).__name__}"
        )


def describe_mesh(
    cfg: MeshConfig,
    sequence_parallel: str | None,
    schedule: str,
    microbatches: int,
    zero_stage: int,
) -> str:
    """The mesh as one line, e.g. ``dp2 x tp2(1d) x pp2(1f1b, m=4)``."""
    parts = [f"dp{cfg.dp}"]
    if cfg.tp > 1:
        megatron = ", megatron sp" if megatron_sequence(sequence_parallel) else ""
        parts.append(f"tp{cfg.tp}({cfg.tp_mode}{megatron})")
    if cfg.pp > 1:
        parts.append(f"pp{cfg.pp}({schedule}, m={microbatches})")
    if cfg.sp > 1:
        parts.append(f"sp{cfg.sp}({long_sequence(sequence_parallel)})")
    return " x ".join(parts) + (f", zero{zero_stage}" if zero_stage else "")
