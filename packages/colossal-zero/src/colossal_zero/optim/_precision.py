"""Training precisions: what the parameters are stored in, and whether fp32 masters and loss
scaling are needed."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from colossal_contracts import ConfigError

__all__ = ["PRECISIONS", "Precision"]


@dataclass(frozen=True)
class Precision:
    """One of ``fp32``, ``bf16``, ``fp16``.

    Attributes:
        name: "fp32", "bf16" or "fp16".
        param_dtype: dtype of the parameters the model computes with (and of their gradients).
        master: True when an fp32 master copy is kept for the optimizer (low-precision params).
        loss_scaling: True when dynamic loss scaling guards gradients against underflow (fp16).
    """

    name: str
    param_dtype: torch.dtype
    master: bool
    loss_scaling: bool

    @classmethod
    def parse(cls, name: str | Precision) -> Precision:
        """The precision called ``name``; ``ConfigError`` listing the choices when unknown."""
        if isinstance(name, Precision):
            return name
        if name not in PRECISIONS:
            raise ConfigError(f"unknown precision {name!r}; choose one of: {', '.join(PRECISIONS)}")
        return PRECISIONS[name]


PRECISIONS: dict[str, Precision] = {
    "fp32": Precision("fp32", torch.float32, master=False, loss_scaling=False),
    "bf16": Precision("bf16", torch.bfloat16, master=True, loss_scaling=False),
    "fp16": Precision("fp16", torch.float16, master=True, loss_scaling=True),
}
