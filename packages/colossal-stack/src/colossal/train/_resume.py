"""Checkpoints that resume exactly: the data position and every rank's RNG states in
``trainer.json`` beside the step (see [Note: exact resume] in ``_rng``)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from torch import nn

from colossal_models.data import TokenLoader

from .._dist import rank_and_world
from ..booster import Booster
from ._rng import capture_rng, gather_rng, restore_rng

__all__ = ["restore_position", "save_with_state"]


def save_with_state(
    booster: Booster,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    root: Path,
    step: int,
    extra: dict[str, Any],
    loader: TokenLoader,
) -> Path | None:
    """``booster.save`` with the data position and every rank's RNG states in ``trainer.json``;
    the generators are as before afterwards ([Note: exact resume])."""
    mine = capture_rng()
    state = {"data": asdict(loader.state()), "rng": gather_rng()}
    path = booster.save(model, optimizer, root, step=step, extra={**extra, **state})
    restore_rng(mine)
    return path


def restore_position(
    loader: TokenLoader, info: dict[str, Any], rank: int, console: Console | None
) -> None:
    """Put the loader and this rank's generators where the checkpoint left them; a checkpoint
    from before they were recorded (or from another world size) resumes inexactly, with a note."""
    if "data" in info:
        loader.load_state(info["data"])
    else:
        loader.position = info["step"] * loader.batch_size * loader.dp_size
    states = info.get("rng")
    if isinstance(states, list) and len(states) == rank_and_world()[1]:
        restore_rng(states[rank])
    elif console is not None:
        console.print(
            "note: the checkpoint holds no RNG states for this world size; dropout after the "
            "resume will differ from an uninterrupted run"
        )
