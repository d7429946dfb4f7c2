"""Gradient clipping by the global norm and skipping fp16 steps that overflowed, as Gemini's
optimizer and ZeRO-1/2 both do them ([Note: loss scaling] in ``_scaler.py``)."""

from __future__ import annotations

import math
from collections.abc import Callable

from colossal_contracts import ConfigError

from ._scaler import DynamicLossScaler

__all__ = ["check_max_grad_norm", "clip_divisor", "skip_step"]


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
        norm = grad_norm()
        if math.isfinite(norm):
            coef = max_grad_norm / (norm + 1e-6)
            if coef < 1.0:
                return loss_scale / coef
    return loss_scale
