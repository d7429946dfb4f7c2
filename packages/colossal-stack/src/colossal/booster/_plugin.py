"""The Plugin Protocol: how a Booster hands a model and optimizer to a training strategy."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

__all__ = ["Plugin"]


@runtime_checkable
class Plugin(Protocol):
    """A training strategy (plain data parallel, Gemini, tensor parallel ...).

    Invariant: after ``configure``, ``backward`` + ``step`` on the returned objects perform one
    optimizer step equivalent to plain PyTorch on the global batch (within the strategy's
    documented numerical tolerance).
    """

    name: str
    device: torch.device  # where the model computes and batches go ([Note: plugin device])

    def configure(
        self, model: nn.Module, optimizer: torch.optim.Optimizer
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        """Wrap or transform model and optimizer for this strategy."""
        ...

    def backward(self, loss: torch.Tensor, optimizer: torch.optim.Optimizer) -> None:
        """Backward of ``loss`` (scaling, hooks and gradient reduction as the strategy needs)."""
        ...

    def unwrap(self, model: nn.Module) -> nn.Module:
        """The user's module inside whatever ``configure`` returned."""
        ...

    def memory_stats(self) -> dict[str, Any]:
        """Per-tier memory and bytes moved, for progress displays and metrics (may be empty)."""
        ...

    def save_checkpoint(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, path: Path
    ) -> None:
        """Write model and optimizer state under the directory ``path``."""
        ...

    def load_checkpoint(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, path: Path
    ) -> None:
        """Restore what ``save_checkpoint`` wrote."""
        ...

    def close(self, *, collective: bool = True) -> None:
        """Join the strategy's background work and threads ([Note: clean exit] in the Booster);
        with ``collective`` also finish collectives in flight and destroy its own process
        groups (every rank calls it then). Idempotent; no training after it."""
        ...
