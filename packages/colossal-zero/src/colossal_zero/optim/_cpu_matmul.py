"""bf16/fp16 matmuls on a CPU without fast kernels for them, computed in fp32.

[Note: cpu matmul] A CPU without bf16 (fp16) instructions runs torch's bf16 (fp16) matmuls on
a slow path, tens of times slower than fp32 at the same shape (docs/zero.md has the figures).
``Fp32Matmul`` is a dispatch mode that, for CPU tensors of those dtypes only, upcasts the
inputs of the matmul family and of CPU scaled-dot-product attention to fp32, runs the op in
fp32 and casts the result back. A bf16 (fp16) product is exact in fp32, so the result is that
of a matmul that accumulates in fp32 and rounds once at the end, which is what the native
kernels compute too: the training is the same bf16 training, only faster. Accelerator tensors,
fp32 and fp64 pass through untouched. Whether a run uses it is decided once, from what the CPU
declares it has (``cpu_has_fast_matmul``), and ``COLOSSAL_CPU_MATMUL`` overrides it.

[Note: modes entered inside] A mode entered while ``Fp32Matmul`` is active can outlive it (Gemini's
warmup recorder is entered in a forward and popped at the next one; see colossal-memtrace's
[Note: recorders of two runtimes]), so on exit ``Fp32Matmul`` leaves the stack from where it
is: the modes above it are exited and re-entered around its exit, in their order.
"""

from __future__ import annotations

import contextlib
import os
import platform
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack
from torch.utils._pytree import tree_map

from colossal_contracts import ConfigError

__all__ = [
    "MATMUL_ENV",
    "MATMUL_SETTINGS",
    "Fp32Matmul",
    "cpu_has_fast_matmul",
    "use_fp32_matmul",
]

MATMUL_ENV = "COLOSSAL_CPU_MATMUL"
MATMUL_SETTINGS = ("auto", "fp32", "native")  # auto: fp32 where the CPU lacks fast kernels

_LOW = (torch.bfloat16, torch.float16)
_aten = torch.ops.aten
# ops computed in fp32, and the outputs they keep in fp32 (CPU flash attention's logsumexp is
# fp32 for bf16 inputs too); every other floating output is cast back to the inputs' dtype
_FP32_OUTPUTS: dict[Any, tuple[int, ...]] = {
    _aten.mm.default: (),
    _aten.addmm.default: (),
    _aten.bmm.default: (),
    _aten.baddbmm.default: (),
    _aten.mv.default: (),
    _aten.addmv.default: (),
    _aten.dot.default: (),
    _aten._scaled_dot_product_flash_attention_for_cpu.default: (1,),
    _aten._scaled_dot_product_flash_attention_for_cpu_backward.default: (),
}
# CPU flags of native kernels per dtype: x86 (Linux /proc/cpuinfo "flags"), Arm ("Features")
_NATIVE_FLAGS = {
    torch.bfloat16: {"avx512_bf16", "amx_bf16", "bf16"},
    torch.float16: {"avx512_fp16", "amx_fp16", "fphp", "asimdhp"},
}


class Fp32Matmul(TorchDispatchMode):
    """Computes bf16/fp16 CPU matmuls (``mm``, ``addmm``, ``bmm``, ``baddbmm``, ``mv``,
    ``addmv``, ``dot``) and CPU flash attention (forward and backward) in fp32 and casts the
    results back ([Note: cpu matmul]); every other op, and these on other devices or dtypes,
    run as they are. ``with Fp32Matmul(): loss = model(x, y); loss.backward()``."""

    def __init__(self, dtypes: tuple[torch.dtype, ...] = _LOW) -> None:
        super().__init__()
        bad = [d for d in dtypes if d not in _LOW]
        if bad:
            raise ConfigError(f"Fp32Matmul(dtypes) takes bfloat16 and float16, got {bad}")
        self.dtypes = tuple(dtypes)

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        keep = _FP32_OUTPUTS.get(func)
        low = None if keep is None else self._low_dtype(args, kwargs)
        if low is None:
            return func(*args, **kwargs)
        up = tree_map(_upcast, (args, kwargs))
        with torch.profiler.record_function("colossal::fp32_matmul"):
            out = func(*up[0], **up[1])
        if isinstance(out, torch.Tensor):
            return out.to(low)
        return type(out)(
            o if i in keep or not _is_float(o) else o.to(low) for i, o in enumerate(out)
        )

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        """Leave the dispatch-mode stack wherever this mode is on it ([Note: modes entered
        inside])."""
        stack = _get_current_dispatch_mode_stack()
        if self not in stack or stack[-1] is self:
            super().__exit__(exc_type, exc, tb)
            return
        above = stack[stack.index(self) + 1 :]
        for mode in reversed(above):
            TorchDispatchMode.__exit__(mode, None, None, None)
        super().__exit__(exc_type, exc, tb)
        for mode in above:
            TorchDispatchMode.__enter__(mode)

    def _low_dtype(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> torch.dtype | None:
        """The low-precision dtype when every floating tensor argument is a CPU tensor and one
        of them has a dtype of ``self.dtypes``; else None (the op runs as it is)."""
        low = None
        for t in (*args, *kwargs.values()):
            if not isinstance(t, torch.Tensor) or not t.is_floating_point():
                continue
            if t.device.type != "cpu":
                return None
            if t.dtype in self.dtypes:
                low = t.dtype
        return low


def _is_float(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.is_floating_point()


def _upcast(x: Any) -> Any:
    return x.float() if isinstance(x, torch.Tensor) and x.dtype in _LOW else x


def cpu_has_fast_matmul(dtype: torch.dtype) -> bool:
    """True when this CPU has native matmul kernels for ``dtype`` (bf16 or fp16): torch's
    oneDNN reports the dtype supported and, where the CPU's flags are readable (Linux), the
    CPU has the instructions (x86 ``avx512_bf16``/``amx_bf16``, ``avx512_fp16``/``amx_fp16``;
    Arm ``bf16``, ``fphp``). fp32 and fp64: always True."""
    if dtype not in _LOW:
        return True
    mkldnn = torch.ops.mkldnn
    query = (
        mkldnn._is_mkldnn_bf16_supported
        if dtype == torch.bfloat16
        else mkldnn._is_mkldnn_fp16_supported
    )
    if not (torch.backends.mkldnn.is_available() and query()):
        return False
    flags = _cpu_flags()
    return flags is None or bool(flags & _NATIVE_FLAGS[dtype])


def _cpu_flags() -> set[str] | None:
    """The CPU's feature flags from ``/proc/cpuinfo``; None where it cannot be read."""
    if platform.system() != "Linux":
        return None
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("flags", "Features"):
                return set(value.split())
    return None


def use_fp32_matmul(
    dtype: torch.dtype,
    device: torch.device | str,
    *,
    setting: str | None = None,
) -> bool:
    """Whether ``dtype`` matmuls on ``device`` run through ``Fp32Matmul``: never off the CPU or
    for fp32/fp64; else by ``setting`` (default: the ``COLOSSAL_CPU_MATMUL`` environment
    variable, else "auto"): "fp32" always, "native" never, "auto" where the CPU lacks fast
    kernels (``cpu_has_fast_matmul``). ``ConfigError`` for another setting."""
    if setting is None:
        setting = os.environ.get(MATMUL_ENV, "auto").strip().lower() or "auto"
    if setting not in MATMUL_SETTINGS:
        raise ConfigError(
            f"{MATMUL_ENV}={setting!r} is not a CPU matmul setting; choose one of: "
            f"{', '.join(MATMUL_SETTINGS)}"
        )
    if torch.device(device).type != "cpu" or dtype not in _LOW or setting == "native":
        return False
    return setting == "fp32" or not cpu_has_fast_matmul(dtype)
