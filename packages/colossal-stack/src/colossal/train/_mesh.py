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
    if cfg.tp > 1:
        out.append(f"--tp {cfg.tp}")
    if cfg.pp > 1:
        out.append(f"--pp {cfg.pp}")
    if cfg.sp is not None:
        out.append(f"--sp {cfg.sp}")
    return out


def resolve_plugin(cfg: TrainConfig) -> tuple[str, int]:
    """``(plugin name, ZeRO stage)`` of ``cfg`` (see [Note: choosing the plugin]); a one-line
    ``ConfigError`` for flags that do not combine."""
    _check_flag_pairs(cfg)
    flags = mesh_flags(cfg)
    long_seq = long_sequence(cfg.sp) is not None
    plugin, zero = cfg.plugin, cfg.zero
    if zero is not None and zero not in _BY_STAGE:
        raise ConfigError(f"--zero must be 0, 1, 2 or 3, got {zero}")
    if plugin is None:
        # activation checkpointing runs on the hybrid plugin: --zero 0-2 with it goes there
        ckpt = cfg.activation_checkpointing and zero in (0, 1, 2)
        mesh = cfg.tp > 1 or cfg.pp > 1 or long_seq
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
        if cfg.zero_stage not in (1, zero):
            raise ConfigError(
                f"--zero {zero} and --zero-stage {cfg.zero_stage} disagree; give one (--zero-stage "
                "is the older spelling)"
            )
        return plugin, zero
    return plugin, cfg.zero_stage  # zero: its stage is checked with the rest of --plugin zero


def combination_of(cfg: TrainConfig, zero: int) -> Combination:
    """The kinds ``cfg``'s flags compose at ZeRO stage ``zero`` (3: Gemini)."""
    return Combination(
        tp=cfg.tp_mode if cfg.tp > 1 else "none",
        sp=cfg.sp or "none",
        pp=cfg.schedule if cfg.pp > 1 else "none",
        sharding="gemini" if zero == 3 else f"zero{zero}",
        precision=cfg.precision,
        checkpointing=cfg.activation_checkpointing,
        lora=cfg.lora_rank is not None,
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
    if cfg.precision != "fp32":
        flags.append(f"--precision {cfg.precision}")
    if cfg.activation_checkpointing:
        flags.append("--activation-checkpointing")
    if cfg.lora_rank is not None:
        flags.append(f"--lora-rank {cfg.lora_rank}")
    return " ".join(flags)


def _check_flag_pairs(cfg: TrainConfig) -> None:
    """Flags that only mean something next to another flag."""
    if cfg.sp is not None and cfg.sp not in SP_METHODS:
        raise ConfigError(f"unknown --sp {cfg.sp!r}; choose one of: {', '.join(SP_METHODS)}")
    needs = [
        (cfg.microbatches != 1, f"--microbatches {cfg.microbatches}", cfg.pp > 1, "--pp N"),
        (cfg.schedule != "1f1b", f"--schedule {cfg.schedule}", cfg.pp > 1, "--pp N"),
        (cfg.tp_mode != "1d", f"--tp-mode {cfg.tp_mode}", cfg.tp > 1, "--tp N"),
        (cfg.tp_depth != 1, f"--tp-depth {cfg.tp_depth}", cfg.tp_mode == "2.5d", "--tp-mode 2.5d"),
        (
            cfg.sp_size != 1,
            f"--sp-size {cfg.sp_size}",
            long_sequence(cfg.sp) is not None,
            "--sp ring or --sp ulysses (megatron uses the tp ranks)",
        ),
        (megatron_sequence(cfg.sp), f"--sp {cfg.sp}", cfg.tp > 1, "--tp N (1d)"),
    ]
    for given, flag, ok, want in needs:
        if given and not ok:
            raise ConfigError(f"{flag} needs {want}; add it or drop {flag.split()[0]}")
    if long_sequence(cfg.sp) is not None and cfg.sp_size < 2:
        raise ConfigError(f"--sp {cfg.sp} needs --sp-size N of 2 or more ranks per sequence")
    if cfg.pp > 1 and cfg.batch_size % cfg.microbatches:
        raise ConfigError(
            f"--batch-size {cfg.batch_size} cannot be split into --microbatches "
            f"{cfg.microbatches}; use a batch size that is a multiple of it"
        )
    parts = _sequence_parts(cfg)
    if parts and cfg.seq_len % parts:
        raise ConfigError(
            f"--sp {cfg.sp} splits each sequence into {parts} parts; use a --seq-len that is a "
            f"multiple of {parts}"
        )


def _sequence_parts(cfg: TrainConfig) -> int:
    """Equal parts ``--sp`` cuts each sequence into (0: none): ring's zigzag 2 per sp rank,
    Ulysses 1; Megatron's split of each such part over the tp ranks."""
    long, megatron = long_sequence(cfg.sp), megatron_sequence(cfg.sp)
    parts = {"ring": 2 * cfg.sp_size, "ulysses": cfg.sp_size}.get(long or "", 1)
    if megatron:  # a ring rank's two zigzag chunks are one slice: T / sp splits over tp
        parts = math.lcm(parts, (cfg.sp_size if long else 1) * cfg.tp)
    return parts if long or megatron else 0


def hybrid_plugin(cfg: TrainConfig) -> HybridParallelPlugin:
    """The hybrid plugin ``cfg`` describes (its own checks run here, before any group)."""
    return HybridParallelPlugin(
        tp_size=cfg.tp,
        tp_mode=cfg.tp_mode,
        tp_depth=cfg.tp_depth,
        sequence_parallel=cfg.sp,
        sp_size=cfg.sp_size,
        pp_size=cfg.pp,
        microbatches=cfg.microbatches * (cfg.grad_accum if cfg.pp > 1 else 1),  # accumulated
        schedule=cfg.schedule,
        zero_stage=cfg.zero,
        precision=cfg.precision,
        activation_checkpointing=cfg.activation_checkpointing,
        max_grad_norm=cfg.max_grad_norm,
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
        virtual = stages // cfg.pp
        most = max(1, spec.num_layers // virtual)
        raise ConfigError(
            f"--pp {cfg.pp} x {virtual} chunk(s) per rank = {stages} stages, and "
            f"{spec.label} has {spec.num_layers} blocks; use --pp {most} or fewer (or a "
            "deeper --preset)"
        )
    if plugin is not None:  # the hybrid plugin: tp*pp*sp must divide the world (which
        plugin.check_world(world)  # makes the checks below hold for it)
    if long_sequence(cfg.sp) and world % cfg.sp_size:
        raise ConfigError(
            f"--sp-size {cfg.sp_size} does not divide the world size {world}; launch a multiple "
            f"of {cfg.sp_size} ranks (colossal run --nproc-per-node N) or change --sp-size"
        )
    elif cfg.tp > 1 and world % cfg.tp:
        raise ConfigError(
            f"--tp {cfg.tp} does not divide the world size {world}; launch a multiple of "
            f"{cfg.tp} ranks (colossal run --nproc-per-node N) or change --tp"
        )
    elif long_sequence(cfg.sp) and world % (cfg.tp * cfg.sp_size):
        raise ConfigError(
            f"--tp {cfg.tp} x --sp-size {cfg.sp_size} does not divide the world size {world}; "
            f"launch a multiple of {cfg.tp * cfg.sp_size} ranks or change the sizes"
        )


def state_shards(cfg: TrainConfig, world: int) -> int:
    """Ranks one model's weights, gradients and Adam states are split over, for the pre-flight
    estimate: every rank under Gemini; tp * pp under the hybrid plugin, times dp with ZeRO (which
    shards the larger part of them, the fp32 states)."""
    if cfg.plugin != "hybrid":
        return world
    sp = cfg.sp_size if long_sequence(cfg.sp) else 1
    dp = max(1, world // (cfg.tp * cfg.pp * sp))
    return cfg.tp * cfg.pp * (dp * sp if cfg.zero else 1)  # ZeRO shards over dp x sp
