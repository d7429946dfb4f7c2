"""The mesh a ``colossal train`` run uses: which plugin its flags select, and the checks of
those flags against each other, the world size and the model, all before any process group.

[Note: choosing the plugin] ``--zero N`` names the ZeRO stage and the plugin follows from it
unless ``--plugin`` names one: 0 is plain data parallelism (ddp), 1 and 2 ZeRO-1/2 (zero), 3
Gemini's chunks (gemini, the default). Any of ``--tp``, ``--pp`` or ``--sp ring|ulysses`` selects
the hybrid plugin instead, which runs ZeRO 0 (the default), 1 or 2 over the data-parallel axis;
ZeRO-3 with tensor parallelism is ``--plugin gemini --tp N``. The older ``--plugin zero
--zero-stage N`` means the same as ``--zero N``.

[Note: mesh data] Every rank of one data-parallel coordinate (``mesh.coord("dp")``: the tensor,
pipeline and sequence ranks of one replica) trains on the same batch: the batch is drawn from the
dp coordinate, not the rank, so the global batch is ``batch_size * dp`` sequences, counted once.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from colossal_contracts import ConfigError

from .._capability import (
    SP_KINDS,
    Combination,
    check_combination,
    long_sequence,
    megatron_sequence,
)
from ..booster import HybridParallelPlugin, Plugin

if TYPE_CHECKING:
    from ._config import TrainConfig
    from ._models import ModelSpec

__all__ = [
    "PLUGINS",
    "SP_METHODS",
    "check_flags",
    "check_mesh",
    "combination_of",
    "hybrid_plugin",
    "mesh_flags",
    "resolve_plugin",
    "state_shards",
]

PLUGINS = ("gemini", "zero", "ddp", "hybrid")
SP_METHODS = ("ring", "ulysses", "megatron", *SP_KINDS[4:])  # "ring+megatron": both
_BY_STAGE = {0: "ddp", 1: "zero", 2: "zero", 3: "gemini"}


def mesh_flags(cfg: TrainConfig) -> list[str]:
    """The flags of ``cfg`` that need a mesh (``--tp 2``, ``--pp 2``, ``--sp ring``)."""
    out = []
    if cfg.parallel.tp > 1:
        out.append(f"--tp {cfg.parallel.tp}")
    if cfg.parallel.pp > 1:
        out.append(f"--pp {cfg.parallel.pp}")
    if cfg.parallel.sp is not None:
        out.append(f"--sp {cfg.parallel.sp}")
    return out


def resolve_plugin(cfg: TrainConfig) -> tuple[str, int]:
    """``(plugin name, ZeRO stage)`` of ``cfg`` (see [Note: choosing the plugin]); a one-line
    ``ConfigError`` for flags that do not combine."""
    _check_flag_pairs(cfg)
    flags = mesh_flags(cfg)
    long_seq = long_sequence(cfg.parallel.sp) is not None
    plugin, zero = cfg.parallel.plugin, cfg.parallel.zero
    if zero is not None and zero not in _BY_STAGE:
        raise ConfigError(f"--zero must be 0, 1, 2 or 3, got {zero}")
    if plugin is None:
        # activation checkpointing runs on the hybrid plugin: --zero 0-2 with it goes there
        ckpt = cfg.model.activation_checkpointing and zero in (0, 1, 2)
        mesh = cfg.parallel.tp > 1 or cfg.parallel.pp > 1 or long_seq
        plugin = "hybrid" if mesh or ckpt else _BY_STAGE.get(zero, "gemini")
    if plugin not in PLUGINS:
        raise ConfigError(f"unknown --plugin {plugin!r}; choose one of: {', '.join(PLUGINS)}")
    if plugin == "hybrid":
        if zero == 3:
            raise ConfigError(
                "--zero 3 does not run on the hybrid plugin (it shards up to ZeRO-2); for ZeRO-3 "
                "with tensor parallelism use --plugin gemini with --tp"
            )
        return plugin, zero or 0
    if plugin == "gemini":
        if zero not in (None, 3):
            raise ConfigError(
                f"--plugin gemini is ZeRO stage 3, not --zero {zero}; drop --plugin gemini (with "
                "--tp/--pp the hybrid plugin runs --zero 0-2) or drop --zero"
            )
        check_combination(combination_of(cfg, 3), what=_flags_text(cfg, 3))
        return plugin, 3
    if flags:
        raise ConfigError(
            f"{', '.join(flags)} runs on the hybrid plugin, not --plugin {plugin}; drop --plugin "
            "and give --zero 0, 1 or 2 (or --plugin gemini --tp N for ZeRO-3)"
        )
    if plugin == "ddp":
        if zero not in (None, 0):
            raise ConfigError(f"--plugin ddp is ZeRO stage 0, not --zero {zero}; drop one of them")
        return plugin, 0
    if plugin == "zero" and zero is not None:
        if zero not in (1, 2):
            raise ConfigError(f"--plugin zero runs --zero 1 or 2, got --zero {zero}")
        if cfg.parallel.zero_stage not in (1, zero):
            raise ConfigError(
                f"--zero {zero} and --zero-stage {cfg.parallel.zero_stage} disagree; give one (--zero-stage "
                "is the older spelling)"
            )
        return plugin, zero
    return (
        plugin,
        cfg.parallel.zero_stage,
    )  # zero: its stage is checked with the rest of --plugin zero


def combination_of(cfg: TrainConfig, zero: int) -> Combination:
    """The kinds ``cfg``'s flags compose at ZeRO stage ``zero`` (3: Gemini)."""
    return Combination(
        tp=cfg.parallel.tp_mode if cfg.parallel.tp > 1 else "none",
        sp=cfg.parallel.sp or "none",
        pp=cfg.parallel.schedule if cfg.parallel.pp > 1 else "none",
        sharding="gemini" if zero == 3 else f"zero{zero}",
        precision=cfg.memory.precision,
        checkpointing=cfg.model.activation_checkpointing,
        lora=cfg.model.lora_rank is not None,
    )


def check_flags(cfg: TrainConfig, zero: int) -> None:
    """``ConfigError`` unless the capability table builds ``cfg``'s flags ([Note: capability
    table]), naming the nearest combination that builds. A stage outside 0-3 is left to the
    plugin's own check, whose message names the stages."""
    if zero not in (0, 1, 2, 3):
        return
    check_combination(combination_of(cfg, zero), what=_flags_text(cfg, zero))


def _flags_text(cfg: TrainConfig, zero: int) -> str:
    flags = [*mesh_flags(cfg), f"--zero {zero}" if zero < 3 else "--plugin gemini"]
    if cfg.memory.precision != "fp32":
        flags.append(f"--precision {cfg.memory.precision}")
    if cfg.model.activation_checkpointing:
        flags.append("--activation-checkpointing")
    if cfg.model.lora_rank is not None:
        flags.append(f"--lora-rank {cfg.model.lora_rank}")
    return " ".join(flags)


def _check_flag_pairs(cfg: TrainConfig) -> None:
    """Flags that only mean something next to another flag."""
    if cfg.parallel.sp is not None and cfg.parallel.sp not in SP_METHODS:
        raise ConfigError(
            f"unknown --sp {cfg.parallel.sp!r}; choose one of: {', '.join(SP_METHODS)}"
        )
    needs = [
        (
            cfg.parallel.microbatches != 1,
            f"--microbatches {cfg.parallel.microbatches}",
            cfg.parallel.pp > 1,
            "--pp N",
        ),
        (
            cfg.parallel.schedule != "1f1b",
            f"--schedule {cfg.parallel.schedule}",
            cfg.parallel.pp > 1,
            "--pp N",
        ),
        (
            cfg.parallel.tp_mode != "1d",
            f"--tp-mode {cfg.parallel.tp_mode}",
            cfg.parallel.tp > 1,
            "--tp N",
        ),
        (
            cfg.parallel.tp_depth != 1,
            f"--tp-depth {cfg.parallel.tp_depth}",
            cfg.parallel.tp_mode == "2.5d",
            "--tp-mode 2.5d",
        ),
        (
            cfg.parallel.sp_size != 1,
            f"--sp-size {cfg.parallel.sp_size}",
            long_sequence(cfg.parallel.sp) is not None,
            "--sp ring or --sp ulysses (megatron uses the tp ranks)",
        ),
        (
            megatron_sequence(cfg.parallel.sp),
            f"--sp {cfg.parallel.sp}",
            cfg.parallel.tp > 1,
            "--tp N (1d)",
        ),
    ]
    for given, flag, ok, want in needs:
        if given and not ok:
            raise ConfigError(f"{flag} needs {want}; add it or drop {flag.split()[0]}")
    if long_sequence(cfg.parallel.sp) is not None and cfg.parallel.sp_size < 2:
        raise ConfigError(
            f"--sp {cfg.parallel.sp} needs --sp-size N of 2 or more ranks per sequence"
        )
    if cfg.parallel.pp > 1 and cfg.data.batch_size % cfg.parallel.microbatches:
        raise ConfigError(
            f"--batch-size {cfg.data.batch_size} cannot be split into --microbatches "
            f"{cfg.parallel.microbatches}; use a batch size that is a multiple of it"
        )
    parts = _sequence_parts(cfg)
    if parts and cfg.data.seq_len % parts:
        raise ConfigError(
            f"--sp {cfg.parallel.sp} splits each sequence into {parts} parts; use a --seq-len that is a "
            f"multiple of {parts}"
        )


def _sequence_parts(cfg: TrainConfig) -> int:
    """Equal parts ``--sp`` cuts each sequence into (0: none): ring's zigzag 2 per sp rank,
    Ulysses 1; Megatron's split of each such part over the tp ranks."""
    long, megatron = long_sequence(cfg.parallel.sp), megatron_sequence(cfg.parallel.sp)
    parts = {"ring": 2 * cfg.parallel.sp_size, "ulysses": cfg.parallel.sp_size}.get(long or "", 1)
    if megatron:  # a ring rank's two zigzag chunks are one slice: T / sp splits over tp
        parts = math.lcm(parts, (cfg.parallel.sp_size if long else 1) * cfg.parallel.tp)
    return parts if long or megatron else 0


def hybrid_plugin(cfg: TrainConfig) -> HybridParallelPlugin:
    """The hybrid plugin ``cfg`` describes (its own checks run here, before any group)."""
    return HybridParallelPlugin(
        **cfg.parallel.mesh_fields(),
        pp_size=cfg.parallel.pp,
        microbatches=cfg.parallel.microbatches
        * (cfg.training.grad_accum if cfg.parallel.pp > 1 else 1),  # accumulated
        schedule=cfg.parallel.schedule,
        zero_stage=cfg.parallel.zero,
        precision=cfg.memory.precision,
        activation_checkpointing=cfg.model.activation_checkpointing,
        max_grad_norm=cfg.training.max_grad_norm,
    )


def check_mesh(cfg: TrainConfig, spec: ModelSpec, plugin: Plugin | None, world: int) -> None:
    """The run's mesh against the model and the world size, before any collective: the
    plugin's pipeline stages against the model's blocks, then its own ``check_world``, then
    the flags a plugin with no check of its own (Gemini's ``--tp``/``--sp``) leaves. None: no
    plugin yet, the flags alone."""
    flags = mesh_flags(cfg)
    if flags and not spec.tp_capable:
        raise ConfigError(
            f"{spec.label} has no tensor/pipeline-parallel adapter, so {', '.join(flags)} cannot "
            "shard it; drop those flags (Gemini, ZeRO and DDP train it unmodified)"
        )
    stages = 1 if plugin is None else plugin.num_stages  # pp x chunks per rank
    if stages > spec.num_layers:
        virtual = stages // cfg.parallel.pp
        most = max(1, spec.num_layers // virtual)
        raise ConfigError(
            f"--pp {cfg.parallel.pp} x {virtual} chunk(s) per rank = {stages} stages, and "
            f"{spec.label} has {spec.num_layers} blocks; use --pp {most} or fewer (or a "
            "deeper --preset)"
        )
    if plugin is not None:  # the hybrid plugin: tp*pp*sp must divide the world (which
        plugin.check_world(world)  # makes the checks below hold for it)
    if long_sequence(cfg.parallel.sp) and world % cfg.parallel.sp_size:
        raise ConfigError(
            f"--sp-size {cfg.parallel.sp_size} does not divide the world size {world}; launch a multiple "
            f"of {cfg.parallel.sp_size} ranks (colossal run --nproc-per-node N) or change --sp-size"
        )
    elif cfg.parallel.tp > 1 and world % cfg.parallel.tp:
        raise ConfigError(
            f"--tp {cfg.parallel.tp} does not divide the world size {world}; launch a multiple of "
            f"{cfg.parallel.tp} ranks (colossal run --nproc-per-node N) or change --tp"
        )
    elif long_sequence(cfg.parallel.sp) and world % (cfg.parallel.tp * cfg.parallel.sp_size):
        raise ConfigError(
            f"--tp {cfg.parallel.tp} x --sp-size {cfg.parallel.sp_size} does not divide the world size {world}; "
            f"launch a multiple of {cfg.parallel.tp * cfg.parallel.sp_size} ranks or change the sizes"
        )


def state_shards(cfg: TrainConfig, world: int) -> int:
    """Ranks one model's weights, gradients and Adam states are split over, for the pre-flight
    estimate: every rank under Gemini; tp * pp under the hybrid plugin, times dp with ZeRO (which
    shards the larger part of them, the fp32 states)."""
    if cfg.parallel.plugin != "hybrid":
        return world
    sp = cfg.parallel.sp_size if long_sequence(cfg.parallel.sp) else 1
    dp = max(1, world // (cfg.parallel.tp * cfg.parallel.pp * sp))
    return (
        cfg.parallel.tp * cfg.parallel.pp * (dp * sp if cfg.parallel.zero else 1)
    )  # ZeRO shards over dp x sp
