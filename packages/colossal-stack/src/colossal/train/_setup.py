"""Setting a ``colossal train`` run up, in the order its checks must come: everything that can
refuse the run (model, mesh, tier room, data) before the model is built, then the model, its
LoRA adapters, the optimizer and the plugin around them, then the loader of this rank's batches."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from colossal_contracts import ConfigError
from colossal_models.data import TextTokenizer, TokenLoader, TokenShards

from ..booster import Booster, Plugin
from ._config import TrainConfig
from ._data import open_data, open_loader
from ._lora_flags import apply_job_lora
from ._mesh import check_mesh, mesh_flags, state_shards
from ._models import ModelSpec, build_model, enable_activation_checkpointing, resolve_model
from ._plugin import _activation_bytes, build_plugin
from ._preflight import check_fits, check_tiers, gemini_host_bytes
from ._step import _param_groups

__all__ = ["Run", "check_run", "set_up"]


@dataclass
class Run:
    """What a run trains with once it is set up.

    Attributes:
        spec: the model's description (label, size, builder).
        plugin, booster: the strategy and the Booster around it (``booster.close()`` ends both).
        model, optimizer: as ``booster.boost`` returned them.
        shards: the tokenized data; loader: this rank's batches in the resumable order.
        dp, dp_group: data-parallel ranks and their group ([Note: mesh data]; None: every rank).
        lora: the LoRA record for ``trainer.json`` (None: full fine-tuning).
    """

    spec: ModelSpec
    plugin: Plugin
    booster: Booster
    model: nn.Module
    optimizer: torch.optim.Optimizer
    shards: TokenShards
    loader: TokenLoader
    dp: int
    dp_group: Any
    lora: dict[str, Any] | None


def check_run(cfg: TrainConfig, tokenizer: TextTokenizer, world: int) -> tuple[ModelSpec, Plugin]:
    """The model's description and the plugin, once the sequence length, the mesh and the
    room of every tier are checked against them (before any group, model or write)."""
    spec = resolve_model(
        cfg.model.name,
        cfg.model.preset,
        vocab_size=tokenizer.vocab_size,
        # LoRA on hf: is wrapped as the HF model; the hybrid plugin converts it after the wrap
        parallel=bool(mesh_flags(cfg))
        and not (cfg.model.lora_rank and cfg.model.name.startswith("hf:")),
        dropout=cfg.model.dropout,
    )
    if cfg.data.seq_len > spec.max_seq_len:
        raise ConfigError(
            f"--seq-len {cfg.data.seq_len} exceeds {spec.label}'s context of "
            f"{spec.max_seq_len}; use a smaller --seq-len"
        )
    plugin = build_plugin(cfg.parallel.plugin, cfg)  # its checks of the settings: before any group
    check_mesh(cfg, spec, plugin, world)
    held = None  # host bytes of the model states; None: check_fits' 16 per parameter
    m = cfg.memory
    if cfg.parallel.plugin == "gemini":  # [Note: tier room]: host, disk and accelerator budgets
        states = check_tiers(
            num_params=spec.num_params,
            label=spec.label,
            precision=m.precision,
            world=state_shards(cfg, world),
            host_bytes=m.host_bytes,
            disk_bytes=m.disk_bytes,
            accelerator_bytes=m.accelerator_bytes,
        )
        held = gemini_host_bytes(
            states, disk_bytes=m.disk_bytes, accelerator_bytes=m.accelerator_bytes
        )
    check_fits(
        build=spec.build,
        num_params=spec.num_params,
        label=spec.label,
        presets=spec.presets,
        batch_size=cfg.data.batch_size,
        seq_len=cfg.data.seq_len,
        sharded=cfg.parallel.plugin in ("gemini", "hybrid"),
        world=state_shards(cfg, world),
        states=held,
    )
    return spec, plugin


def set_up(
    cfg: TrainConfig, tokenizer: TextTokenizer, resume_from: Path | None, *, rank: int, world: int
) -> Run:
    """Check the run (``check_run``) and the data, then build and boost the model."""
    spec, plugin = check_run(cfg, tokenizer, world)
    shards = open_data(cfg, tokenizer, rank=rank)  # bad data: an error before any write
    open_loader(cfg, shards)  # data shorter than one sequence: an error here too
    torch.manual_seed(cfg.training.seed)  # same initial weights on every rank
    # LoRA fingerprints the base's values and wraps it eagerly (peft builds real adapters)
    lazy_ok = cfg.model.lora_rank is None
    model, lazy = build_model(spec, cfg.parallel.plugin, lazy=lazy_ok)  # [Note: lazy job]
    if cfg.model.activation_checkpointing and cfg.parallel.plugin != "hybrid":  # hybrid's own
        enable_activation_checkpointing(model)
    model, lora = apply_job_lora(cfg, spec.label, model, resume_from)  # before any state
    t = cfg.training
    optimizer = torch.optim.AdamW(  # every plugin keeps the groups (sharding ones by name)
        _param_groups(model, t.weight_decay),
        lr=t.lr,
        betas=(0.9, 0.95),
        weight_decay=t.weight_decay,
    )
    plugin.reserve_activations(lambda: _activation_bytes(spec, cfg))  # under a budget
    if lazy is not None:
        plugin.lazy = lazy  # materialized where it lives ([Note: lazy job])
    booster = Booster(plugin)
    model, optimizer = booster.boost(model, optimizer)
    # [Note: mesh data]: one batch per data-parallel coordinate, losses averaged over dp
    mesh = plugin.mesh
    data_rank, dp = (mesh.coord("dp"), mesh.size("dp")) if mesh else (rank, world)
    dp_group = mesh.group("dp") if mesh else None
    loader = open_loader(cfg, shards, dp_rank=data_rank, dp_size=dp)
    return Run(spec, plugin, booster, model, optimizer, shards, loader, dp, dp_group, lora)
