"""Gradient clipping by the global norm and skipping fp16 steps that overflowed, as Gemini's
optimizer and ZeRO-1/2 both do them ([Note: loss scaling] in ``_scaler.py``): ``ClippedAdam``
is what both optimizers are around their own update. ``clip_coef`` is the clip factor itself,
also what the hybrid plugin's own step (no ZeRO) multiplies its gradients by
(``GradNorm.clip_coef``)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch

from colossal_contracts import ConfigError

from ._adam import AdamHyper
from ._scaler import DynamicLossScaler, LossScalerConfig

__all__ = ["ClippedAdam", "check_max_grad_norm", "clip_coef", "clip_divisor", "skip_step"]


def check_max_grad_norm(max_grad_norm: float) -> None:
    """Raise ``ConfigError`` unless ``0 <= max_grad_norm < inf`` (0: no clipping; nan fails)."""
    if not (0 <= max_grad_norm < math.inf):
        raise ConfigError(
            f"max_grad_norm must be finite and >= 0 (0: no clipping), got {max_grad_norm}"
        )


def skip_step(scaler: DynamicLossScaler | None, overflow: bool) -> bool:
    """Whether this step is skipped: with a loss scaler, when the gradients overflowed (the
    scaler then lowers its scale). Without one, never."""
    if scaler is None or not overflow:
        return False
    scaler.update(True)
    return True


def clip_divisor(loss_scale: float, max_grad_norm: float, grad_norm: Callable[[], float]) -> float:
    """What the gradients are divided by in the update: the loss scale, and with
    ``max_grad_norm > 0`` the clip factor too when the (unscaled) norm exceeds it. ``grad_norm``
    is called only then (Gemini computes its norm on demand: [Note: norm on demand]). A
    non-finite norm without a scaler has nothing to clip to: the divisor stays the loss scale and
    the caller's non-finite guard stops the run."""
    if max_grad_norm > 0:
        coef = clip_coef(max_grad_norm, grad_norm())
        if coef < 1.0:
            return loss_scale / coef
    return loss_scale


def clip_coef(max_grad_norm: float, norm: float) -> float:
    """The factor that clips gradients of global (unscaled) norm ``norm`` to ``max_grad_norm``:
    ``max_grad_norm / (norm + 1e-6)`` where that is below 1, else 1.0 (no clipping:
    ``max_grad_norm`` 0, a norm within it, or a non-finite norm, which has nothing to clip to)."""
    if max_grad_norm > 0 and math.isfinite(norm):
        coef = max_grad_norm / (norm + 1e-6)
        if coef < 1.0:
            return coef
    return 1.0


class ClippedAdam(torch.optim.Optimizer):
    """An Adam/AdamW whose step clips by the global norm and, with a loss scaler, skips steps
    whose gradients overflowed: the part Gemini's and ZeRO-1/2's optimizers share. A subclass's
    ``step`` computes the norm and overflow its way, asks ``_skip(overflow)``, divides the
    gradients by ``_divisor(norm)`` in its update, then calls ``_stepped()``.

    ``loss_scaler`` is the scaler's config when the precision scales losses (fp16), else None.
    """

    adamw: bool  # decoupled weight decay (AdamW) rather than L2 (Adam)
    max_grad_norm: float  # 0: no clipping
    scaler: DynamicLossScaler | None  # fp16 only
    skipped_last: bool  # the last step overflowed and was skipped

    def __init__(
        self,
        params: Iterable[Any],  # tensors or param groups, as for torch.optim.AdamW
        lr: float,
        betas: tuple[float, float],
        eps: float,
        weight_decay: float,
        *,
        adamw: bool,
        max_grad_norm: float,
        loss_scaler: LossScalerConfig | None,
    ) -> None:
        check_max_grad_norm(max_grad_norm)
        AdamHyper(lr, betas, eps, weight_decay, adamw)  # validates
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}
        super().__init__(params, defaults)
        self.adamw, self.max_grad_norm = adamw, max_grad_norm
        self.scaler = DynamicLossScaler(loss_scaler) if loss_scaler is not None else None
        self.skipped_last = False

    @property
    def loss_scale(self) -> float:
        return self.scaler.scale if self.scaler is not None else 1.0

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``, scaled by the loss scale under fp16."""
        (loss * self.loss_scale if self.scaler is not None else loss).backward()

    def _skip(self, overflow: bool) -> bool:
        """Whether this step is skipped (``skip_step``); kept as ``skipped_last``."""
        self.skipped_last = skip_step(self.scaler, overflow)
        return self.skipped_last

    def _divisor(self, grad_norm: Callable[[], float]) -> float:
        """What the update divides the gradients by (``clip_divisor``)."""
        return clip_divisor(self.loss_scale, self.max_grad_norm, grad_norm)

    def _stepped(self) -> None:
        """The update ran: the loss scaler counts a clean step."""
        if self.scaler is not None:
            self.scaler.update(False)
