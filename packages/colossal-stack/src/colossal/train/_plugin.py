"""The plugin a training job runs under: built from its ``TrainConfig`` (``build_plugin``),
what its checkpoints hold and the activation room it keeps (asked of the plugin through the
``Plugin`` Protocol: [Note: plugin hooks])."""

from __future__ import annotations

import torch

from colossal_contracts import ConfigError
from colossal_memtrace import estimate_step

from ..booster import DDPPlugin, GeminiConfig, GeminiPlugin, LowLevelZeroPlugin, Plugin
from ._config import TrainConfig
from ._mesh import PLUGINS, hybrid_plugin
from ._models import ModelSpec

__all__ = ["build_plugin"]


def build_plugin(name: str, cfg: TrainConfig | None = None) -> Plugin:
    """The plugin called ``name`` set up from ``cfg`` (Gemini's placement, budget and
    precision; the hybrid plugin's mesh); ``ConfigError`` naming the choices when unknown.
    Constructing one creates no process group: its own checks of the settings run here."""
    if name == "ddp":
        return DDPPlugin()
    if name == "hybrid":
        return hybrid_plugin(cfg or TrainConfig.from_flags(plugin="hybrid"))
    if name == "gemini":
        cfg = cfg or TrainConfig.from_flags()
        return _gemini_plugin(cfg)
    if name == "zero":
        cfg = cfg or TrainConfig.from_flags(plugin="zero")
        return LowLevelZeroPlugin(
            stage=cfg.parallel.zero_stage,
            precision=cfg.memory.precision,
            max_grad_norm=cfg.training.max_grad_norm,
        )
    raise ConfigError(f"unknown --plugin {name!r}; choose one of: {', '.join(PLUGINS)}")


def _gemini_plugin(cfg: TrainConfig) -> Plugin:
    """Gemini, with tensor parallelism inside its chunks for ``--tp N`` (ZeRO-3 with TP)."""
    config = GeminiConfig(
        precision=cfg.memory.precision,
        placement=cfg.memory.placement,
        accelerator_bytes=cfg.memory.accelerator_bytes,
        host_bytes=cfg.memory.host_bytes,
        disk_bytes=cfg.memory.disk_bytes,
        disk_dir=cfg.memory.disk_dir,
        states_placement=cfg.memory.states_placement,
    )
    return GeminiPlugin(
        config=config,
        max_grad_norm=cfg.training.max_grad_norm,
        # a TrainConfig gives Gemini ring/Ulysses or no --sp, and --sp-size only with them
        # (resolve_plugin's flag pairs, the capability table)
        **cfg.parallel.mesh_fields(),
    )


def _choose_export(plugin: Plugin, cfg: TrainConfig, step: int) -> None:
    """Before saving after ``step``: whether the plugins with a sharded state write the
    consolidated model into this checkpoint too (``--export``); a LoRA run's checkpoints hold
    the adapters and their optimizer state, not the frozen base (rebuilt from its source on
    resume and checked against the fingerprint in ``trainer.json``)."""
    lora = cfg.model.lora_rank is not None
    plugin.choose_checkpoint_contents(
        export_full_model=cfg.exports_at(step) and not lora, save_frozen=not lora
    )


def _activation_bytes(spec: ModelSpec, cfg: TrainConfig) -> int:
    """Peak non-model (activation) bytes of one step on the accelerator, from memtrace's static
    estimate on the meta device: what Gemini keeps free of chunks under ``--accelerator-budget``."""
    shape = (cfg.data.batch_size, cfg.data.seq_len)
    try:
        stats = estimate_step(
            spec.build,
            lambda dev: (torch.zeros(shape, dtype=torch.long, device=dev),) * 2,
            target="cuda" if torch.cuda.is_available() else "cpu",
        )
    except RuntimeError:  # a forward that reads values (HF masks call .item()): no meta estimate;
        return 0  # the warmup keeps its default share free and measures the step itself
    return stats.peak_non_model("accelerator")
