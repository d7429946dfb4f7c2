"""A ``torch.optim.Adam``/``AdamW`` as the arguments of colossal-zero's optimizers, checked once
for Gemini and ZeRO-1/2."""

from __future__ import annotations

from typing import Any

import torch

from colossal_contracts import ConfigError

__all__ = ["adam_arguments"]

_GROUP_KEYS = ("params", "lr", "betas", "eps", "weight_decay")


def adam_arguments(optimizer: torch.optim.Optimizer, *, who: str) -> tuple[list[dict], dict]:
    """The param groups of ``optimizer`` and the keyword arguments (``lr``, ``betas``, ``eps``,
    ``weight_decay``, ``adamw``) that rebuild it as a colossal-zero optimizer; ``who`` names the
    method in errors ("Gemini", "ZeRO"). Raises ``ConfigError`` for anything but Adam/AdamW, and
    for amsgrad or maximize."""
    if not isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW):
        raise ConfigError(
            f"{who} trains with Adam or AdamW, got {type(optimizer).__name__}; build the "
            "optimizer as torch.optim.AdamW(...)"
        )
    d = optimizer.defaults
    if d.get("amsgrad") or d.get("maximize"):
        raise ConfigError(f"{who}'s Adam supports neither amsgrad nor maximize; turn them off")
    groups = [{k: v for k, v in g.items() if k in _GROUP_KEYS} for g in optimizer.param_groups]
    kwargs: dict[str, Any] = {k: d[k] for k in ("lr", "betas", "eps", "weight_decay")}
    kwargs["adamw"] = isinstance(optimizer, torch.optim.AdamW)
    return groups, kwargs
