"""Training precisions: what the parameters are stored in, and whether fp32 masters and loss
scaling are needed.

[Note: fp64 precision] ``fp64`` keeps parameters, gradients, Adam's moments and every reduction
in float64, with no master copy and no loss scaling: the ZeRO-1/2 buckets, Gemini's chunks (and
their gradient and state twins) and the update all take ``state_dtype``. It exists to show the
parallel algorithms exact (a layout equals single-process AdamW in float64 within rounding of
1e-16 per operation) where fp32 masters would hide the algorithm behind fp32 rounding. Every
other precision keeps its optimizer values in fp32 (``state_dtype`` float32), as before.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from colossal_contracts import ConfigError

from ._cpu_matmul import Fp32Matmul, use_fp32_matmul

__all__ = ["PRECISIONS", "Precision"]


@dataclass(frozen=True)
class Precision:
    """One of ``fp32``, ``bf16``, ``fp16``, ``fp64``.

    Attributes:
        name: "fp32", "bf16", "fp16" or "fp64".
        param_dtype: dtype of the parameters the model computes with (and of their gradients).
        master: True when an fp32 master copy is kept for the optimizer (low-precision params).
        loss_scaling: True when dynamic loss scaling guards gradients against underflow (fp16).
        state_dtype: dtype of what the optimizer updates and keeps: masters (or the parameters
            themselves without), the gradients it reads, Adam's moments. float64 for fp64 only
            ([Note: fp64 precision]).
    """

    name: str
    param_dtype: torch.dtype
    master: bool
    loss_scaling: bool
    state_dtype: torch.dtype = torch.float32

    @classmethod
    def parse(cls, name: str | Precision) -> Precision:
        """The precision called ``name``; ``ConfigError`` listing the choices when unknown."""
        if isinstance(name, Precision):
            return name
        if name not in PRECISIONS:
            raise ConfigError(f"unknown precision {name!r}; choose one of: {', '.join(PRECISIONS)}")
        return PRECISIONS[name]

    def matmul_mode(self, device: torch.device | str, *, setting: str | None = None) -> str:
        """How this precision's matmuls on ``device`` run: "fp32" (computed in fp32 and cast
        back: a CPU without fast bf16/fp16 kernels, or ``COLOSSAL_CPU_MATMUL=fp32``; see
        [Note: cpu matmul]) or "native". ``setting`` overrides the environment."""
        fp32 = use_fp32_matmul(self.param_dtype, device, setting=setting)
        return "fp32" if fp32 else "native"

    def matmul_note(self, device: torch.device | str, *, setting: str | None = None) -> str | None:
        """One line saying that this precision's matmuls are computed in fp32 on this CPU;
        None where they run natively."""
        if self.matmul_mode(device, setting=setting) == "native":
            return None
        return f"{self.name} matmuls computed in fp32 on this CPU"

    def compute(
        self, device: torch.device | str, *, setting: str | None = None
    ) -> contextlib.AbstractContextManager[object]:
        """The context forward and backward run in: ``Fp32Matmul`` where ``matmul_mode`` is
        "fp32", else one that does nothing."""
        if self.matmul_mode(device, setting=setting) == "native":
            return contextlib.nullcontext()
        return Fp32Matmul((self.param_dtype,))

    def check_device(self, device: torch.device | str) -> None:
        """``ConfigError`` when ``device`` cannot hold this precision's tensors (float64 on a
        device without it, such as Apple's ``mps``)."""
        dev = torch.device(device)
        if self.state_dtype == torch.float64 and dev.type in _NO_FLOAT64:
            raise ConfigError(
                f"precision 'fp64' needs float64 tensors, which the {dev.type!r} device does not "
                "have; use precision='fp32' there, or run fp64 on the CPU or a CUDA device"
            )


_NO_FLOAT64 = ("mps",)  # device types without float64 arithmetic

PRECISIONS: dict[str, Precision] = {
    "fp32": Precision("fp32", torch.float32, master=False, loss_scaling=False),
    "bf16": Precision("bf16", torch.bfloat16, master=True, loss_scaling=False),
    "fp16": Precision("fp16", torch.float16, master=True, loss_scaling=True),
    "fp64": Precision(
        "fp64", torch.float64, master=False, loss_scaling=False, state_dtype=torch.float64
    ),
}
