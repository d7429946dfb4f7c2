"""Rank-side and reference halves of ``test_train_mesh.py``.

``train_on_mesh`` runs ``colossal.train.train`` on every rank of a World; ``reference_losses``
trains the same model in one process with plain ``torch.optim.AdamW`` on the global batch: the
batches of every data-parallel coordinate, concatenated (coordinate ``d`` reads the ``d``-th
slice of each global batch of the loader, [Note: data order]), with the loop's learning-rate
schedule and its two parameter groups (decay on matrices only), which every plugin keeps.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from _stack_reference import adamw_losses

from colossal import TrainConfig, train
from colossal.train._data import open_data, open_loader, resolve_tokenizer
from colossal.train._models import resolve_model
from colossal.train._schedule import warmup_cosine
from colossal.train._step import _param_groups
from colossal_contracts import ConfigError


def train_on_mesh(kw: dict[str, Any]) -> dict[str, Any]:
    """One ``train`` run of ``TrainConfig.from_flags(**kw)``; rank 0 also returns its metrics records."""
    result = train(TrainConfig.from_flags(**kw))
    out: dict[str, Any] = {"losses": result.losses, "val_loss": result.val_loss}
    if dist.get_rank() == 0:
        lines = (Path(kw["out"]) / "metrics.jsonl").read_text().splitlines()
        out["records"] = [json.loads(x) for x in lines]
        out["checkpoint"] = str(result.checkpoint)
    return out


def mesh_error(kw: dict[str, Any]) -> str:
    """The ``ConfigError`` that ``train(TrainConfig.from_flags(**kw))`` raises on this rank (or 'no error')."""
    try:
        train(TrainConfig.from_flags(**kw))
    except ConfigError as err:
        return str(err)
    return "no error"


def reference_losses(kw: dict[str, Any], dp: int) -> list[float]:
    """Single-process AdamW on the global batch of ``dp`` data-parallel coordinates."""
    return reference_run(kw, dp)[0]


def reference_run(kw: dict[str, Any], dp: int) -> tuple[list[float], dict[str, torch.Tensor]]:
    """``reference_losses`` and the final weights (the model's state dict)."""
    cfg = TrainConfig.from_flags(**kw)
    tokenizer = resolve_tokenizer(cfg)
    spec = resolve_model(cfg.model.name, cfg.model.preset, vocab_size=tokenizer.vocab_size)
    # one loader with the global batch: the dp coordinates' batches, concatenated
    loader = open_loader(
        cfg.replace(batch_size=cfg.data.batch_size * dp), open_data(cfg, tokenizer, rank=0)
    )
    torch.manual_seed(cfg.training.seed)
    model = spec.build()
    opt = torch.optim.AdamW(
        _param_groups(model, cfg.training.weight_decay),
        lr=cfg.training.lr,
        betas=(0.9, 0.95),
        weight_decay=cfg.training.weight_decay,
    )
    batches = (loader.next_batch() for _ in range(cfg.training.steps))
    losses = adamw_losses(
        model, batches, opt, lr_at=lambda s: cfg.training.lr * warmup_cosine(s, cfg.training.steps)
    )
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}
