"""The Booster: one object that applies a plugin to a model and its optimizer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from colossal_contracts import CheckpointError

from ._checkpoint import latest_checkpoint, write_checkpoint_dir, write_checkpoint_dir_all_ranks
from ._ddp import DDPPlugin
from ._plugin import Plugin

__all__ = ["TRAINER_FILE", "Booster"]

TRAINER_FILE = "trainer.json"


class Booster:
    """``model, optimizer = Booster(plugin).boost(model, optimizer)``; then ``backward`` and
    ``optimizer.step()`` as usual. Checkpoints go through the plugin and are atomic."""

    def __init__(self, plugin: Plugin | None = None):
        self.plugin: Plugin = plugin or DDPPlugin()

    def boost(
        self, model: nn.Module, optimizer: torch.optim.Optimizer
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        return self.plugin.configure(model, optimizer)

    def backward(self, loss: torch.Tensor, optimizer: torch.optim.Optimizer) -> None:
        self.plugin.backward(loss, optimizer)

    def unwrap(self, model: nn.Module) -> nn.Module:
        return self.plugin.unwrap(model)

    def memory_stats(self) -> dict[str, Any]:
        return self.plugin.memory_stats()

    def save(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        root: Path,
        *,
        step: int,
        extra: dict[str, Any] | None = None,
    ) -> Path | None:
        """Save a checkpoint ``root/step-<step>`` (rank 0 publishes it); returns its path on rank 0.

        ``trainer.json`` beside the plugin's files records ``step`` and ``extra``.
        """
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0

        def write(directory: Path) -> None:
            self.plugin.save_checkpoint(model, optimizer, directory)
            if rank == 0:
                info = {"step": step, **(extra or {})}
                (directory / TRAINER_FILE).write_text(json.dumps(info, indent=2, default=str))

        if getattr(self.plugin, "sharded_checkpoint", False):  # every rank writes its shard
            return write_checkpoint_dir_all_ranks(root, step, write, rank=rank)
        path = write_checkpoint_dir(root, step, write) if rank == 0 else None
        if dist.is_available() and dist.is_initialized():
            dist.barrier()
        return path

    def load(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, root: Path
    ) -> dict[str, Any]:
        """Restore the checkpoint ``root/latest`` names (or ``root`` itself); return its
        ``trainer.json`` with ``path`` added."""
        path = latest_checkpoint(root) if (root / "latest").exists() else root
        try:
            info = json.loads((path / TRAINER_FILE).read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise CheckpointError(
                f"checkpoint {path} has no readable {TRAINER_FILE}: {err}"
            ) from err
        self.plugin.load_checkpoint(model, optimizer, path)
        return {**info, "path": path}
