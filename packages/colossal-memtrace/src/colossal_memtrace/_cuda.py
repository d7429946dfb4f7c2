"""CUDA memory: the caching allocator's counters, plus NVML for what the allocator cannot see.

[Note: CUDA fallback] A missing GPU or a missing/broken NVML never raises. The probe says once, in
plain words (a ``RuntimeWarning``; Python shows a given warning once per call site), what it cannot
see and falls back: without NVML it reports the allocator counters alone; without a GPU it delegates
to its ``fallback`` probe (by default host RSS labelled as an emulated accelerator).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch

from colossal_contracts import MemoryProbe, MemorySample, TierName

from ._host import HostProbe

__all__ = ["CudaMemoryDetail", "CudaProbe"]


@dataclass(frozen=True)
class CudaMemoryDetail:
    """Everything the CUDA probe knows about one device, in bytes.

    Attributes:
        allocated: bytes in tensors the caching allocator handed out.
        reserved: bytes the allocator holds from the driver (allocated + its cache).
        peak_allocated: highest ``allocated`` since the last peak reset.
        device_used: bytes in use on the whole device per NVML (None without NVML).
        device_total: the device's capacity per NVML, else per torch.
        outside_allocator: ``device_used - reserved``: CUDA context, other libraries and processes
            (None without NVML).
    """

    allocated: int
    reserved: int
    peak_allocated: int
    device_used: int | None
    device_total: int
    outside_allocator: int | None


def _load_nvml() -> ModuleType | None:
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


class CudaProbe:
    """A ``MemoryProbe`` for one CUDA device (the accelerator tier); see [Note: CUDA fallback].

    ``cuda`` and ``nvml`` default to ``torch.cuda`` and ``pynvml``; tests pass stand-ins.
    """

    tier = TierName.ACCELERATOR

    def __init__(
        self,
        device: int = 0,
        *,
        fallback: MemoryProbe | None = None,
        cuda: Any = None,
        nvml: Any = "auto",
    ):
        self.device = device
        self._cuda = torch.cuda if cuda is None else cuda
        self.name = f"cuda:{device}"
        self.notes: list[str] = []
        self.available = bool(self._cuda.is_available()) and device < self._cuda.device_count()
        self._fallback: MemoryProbe | None = None
        self._nvml: Any = None
        self._handle: Any = None
        if not self.available:
            self._fallback = fallback or HostProbe(tier=TierName.ACCELERATOR, emulated=True)
            self._say(
                f"no CUDA device {device} is available; memory figures for the accelerator come "
                f"from {self._fallback.name} instead (emulated)"
            )
            self.name = f"cuda:{device}->{self._fallback.name}"
            return
        # torch's allocator counters exist once CUDA is initialised: before the first CUDA
        # tensor, reset_peak_memory_stats raises "Invalid device argument" (seen on an H200)
        init = getattr(self._cuda, "init", None)
        if init is not None:
            init()
        nvml_mod = _load_nvml() if nvml == "auto" else nvml
        if nvml_mod is None:
            self._say(
                "pynvml is not installed, so memory outside torch's allocator (CUDA context, "
                "other processes) is not seen; install colossal-memtrace[gpu] to see it"
            )
            return
        try:
            nvml_mod.nvmlInit()
            self._handle = nvml_mod.nvmlDeviceGetHandleByIndex(device)
            self._nvml = nvml_mod
        except Exception as exc:  # NVMLError subclasses Exception; any failure means no NVML
            self._say(
                f"NVML could not be started ({exc}); reporting torch's allocator counters only"
            )

    def _say(self, message: str) -> None:
        self.notes.append(message)
        warnings.warn(f"colossal-memtrace: {message}", RuntimeWarning, stacklevel=3)

    @property
    def emulated(self) -> bool:
        return not self.available

    def detail(self) -> CudaMemoryDetail | None:
        """All counters of the device, or None when no GPU is present."""
        if not self.available:
            return None
        c, d = self._cuda, self.device
        allocated, reserved = int(c.memory_allocated(d)), int(c.memory_reserved(d))
        used = total = None
        if self._nvml is not None:
            try:
                info = self._nvml.nvmlDeviceGetMemoryInfo(self._handle)
                used, total = int(info.used), int(info.total)
            except Exception as exc:
                self._say(f"NVML stopped answering ({exc}); using torch's counters only")
                self._nvml = None
        if total is None:
            total = int(c.get_device_properties(d).total_memory)
        return CudaMemoryDetail(
            allocated=allocated,
            reserved=reserved,
            peak_allocated=int(c.max_memory_allocated(d)),
            device_used=used,
            device_total=total,
            outside_allocator=None if used is None else max(0, used - reserved),
        )

    def sample(self) -> MemorySample:
        if self._fallback is not None:
            s = self._fallback.sample()
            return MemorySample(s.used_bytes, s.peak_bytes, emulated=True)
        d = self.detail()
        assert d is not None  # available implies detail
        return MemorySample(used_bytes=d.allocated, peak_bytes=d.peak_allocated)

    def reset_peak(self) -> None:
        if self._fallback is not None:
            self._fallback.reset_peak()
        else:
            self._cuda.reset_peak_memory_stats(self.device)
