"""Activation checkpointing of transformer blocks, as a flag the block reads (no wrapper module,
so parameter names, state dicts and tensor-parallel plans are unchanged by it)."""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.utils.checkpoint import checkpoint

__all__ = ["CheckpointedBlock", "apply_activation_checkpointing"]


class CheckpointedBlock(nn.Module):
    """Base of a block whose ``forward`` recomputes ``_forward`` in backward when asked.

    Attributes:
        activation_checkpointing: keep only the block input in forward and recompute the rest
            in backward (non-reentrant ``torch.utils.checkpoint``); off by default.
    """

    activation_checkpointing: bool = False

    def _forward(self, *args: Any) -> Any:
        raise NotImplementedError

    def forward(self, *args: Any) -> Any:
        if self.activation_checkpointing and self.training:
            return checkpoint(self._forward, *args, use_reentrant=False)
        return self._forward(*args)


def apply_activation_checkpointing(model: nn.Module, *, enabled: bool = True) -> int:
    """Turn checkpointing on (or off) for every ``CheckpointedBlock`` in ``model``; their count."""
    count = 0
    for module in model.modules():
        if isinstance(module, CheckpointedBlock):
            module.activation_checkpointing = enabled
            count += 1
    return count
