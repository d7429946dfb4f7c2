"""Stopping a run whose numbers stopped being numbers, before it saves them.

[Note: non-finite training] Every step the loss (averaged over ranks, so all ranks agree) is
checked before backward: a nan/inf loss stops the run at once, weights unchanged. Gradients are
checked before the update where the optimizer leaves them to us (plain torch optimizers); an
optimizer that checks them itself reports through ``OverflowReporting``: with a loss scaler
(fp16) an overflow skips the step, and ``max_skipped`` skipped steps in a row stop the run (the
scale has backed off to its floor and gradients still overflow); without one a non-finite gradient
norm means the update already spread it, and the run stops. Stopping raises ``NonFiniteError``
before any save, so a non-finite checkpoint never replaces a good one.
"""

from __future__ import annotations

import math
from typing import Protocol, runtime_checkable

import torch
from torch import nn

from colossal_contracts import ColossalError

__all__ = ["FiniteGuard", "NonFiniteError", "OverflowReporting"]


class NonFiniteError(ColossalError, FloatingPointError):
    """Training produced nan/inf (loss or gradients) and was stopped before saving."""


@runtime_checkable
class OverflowReporting(Protocol):
    """An optimizer that checks the global gradient norm in ``step`` (Gemini's does)."""

    skipped_last: bool  # the last step was skipped because gradients overflowed
    last_grad_norm: float  # unscaled global gradient norm of the last step

    @property
    def loss_scale(self) -> float: ...


class FiniteGuard:
    """See [Note: non-finite training]. One per run; calls in step order."""

    def __init__(self, *, precision: str, lr: float, max_skipped: int = 25):
        self.precision = precision
        self.lr = lr
        self.max_skipped = max_skipped
        self._skipped_since: int | None = None  # first step of the current run of skips
        self._num_skipped = 0

    def _cause(self) -> str:
        hint = f"the learning rate ({self.lr:g}) may be too high: lower --lr"
        if self.precision in ("fp16", "bf16"):
            hint += f", or train in --precision fp32 (now {self.precision})"
        return hint

    def check_loss(self, step: int, loss: float) -> None:
        """Before backward; ``step`` is 1-based."""
        if not math.isfinite(loss):
            raise NonFiniteError(
                f"step {step}: the loss is {loss} (weights are still those after step "
                f"{step - 1}); stopped without saving. {self._cause()}; then --resume from the "
                "last checkpoint"
            )

    def check_grads(self, step: int, model: nn.Module, optimizer: object) -> None:
        """Before ``optimizer.step()`` of an optimizer that does not check gradients itself."""
        if isinstance(optimizer, OverflowReporting):
            return
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        if not grads:
            return
        norm = float(torch.nn.utils.get_total_norm(grads))
        if not math.isfinite(norm):
            raise NonFiniteError(
                f"step {step}: the gradient norm is {norm} (loss was finite); the update was not "
                f"applied and the run stopped without saving. {self._cause()}"
            )

    def after_step(self, step: int, optimizer: object) -> None:
        """After ``optimizer.step()``: count skipped (overflowed) steps; stop when hopeless."""
        if not isinstance(optimizer, OverflowReporting):
            return
        if optimizer.skipped_last:
            self._num_skipped += 1
            if self._skipped_since is None:
                self._skipped_since = step
            if self._num_skipped >= self.max_skipped:
                raise NonFiniteError(
                    f"step {step}: gradients overflowed in every step since step "
                    f"{self._skipped_since} ({self._num_skipped} steps skipped, loss scale now "
                    f"{optimizer.loss_scale:g}); {self.precision} cannot hold them. Use "
                    "--precision bf16 (or fp32), or lower --lr; stopped without saving"
                )
            return
        self._skipped_since, self._num_skipped = None, 0
        if not math.isfinite(optimizer.last_grad_norm):
            raise NonFiniteError(
                f"step {step}: the gradient norm is {optimizer.last_grad_norm} and the update "
                "made the weights non-finite; stopped without saving (the last checkpoint is "
                f"intact). {self._cause()}; then --resume from the last checkpoint"
            )
