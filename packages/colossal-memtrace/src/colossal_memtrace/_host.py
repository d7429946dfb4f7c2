"""Host memory: this process's resident (RSS) or unique (USS) set, and the system's free memory."""

from __future__ import annotations

from typing import Literal

import psutil

from colossal_contracts import ConfigError, MemorySample, TierName

__all__ = ["HostProbe"]


class HostProbe:
    """A ``MemoryProbe`` for this process's host memory, read through psutil.

    ``measure="rss"`` (resident set, cheap) or ``"uss"`` (memory unique to this process, slower:
    it walks the page map). The OS keeps no resettable peak, so ``peak_bytes`` is the highest value
    this probe has read since ``reset_peak``: poll it (``SamplingTracer``) to catch short peaks.
    RSS moves in pages and includes the allocator's caches, so it is too coarse to judge small
    changes: use ``LiveTensorProbe`` for exact tensor bytes.
    """

    def __init__(
        self,
        measure: Literal["rss", "uss"] = "rss",
        *,
        tier: TierName = TierName.HOST,
        emulated: bool = False,
    ):
        if measure not in ("rss", "uss"):
            raise ConfigError(f"HostProbe measure must be 'rss' or 'uss', got {measure!r}")
        self.measure = measure
        self.tier = TierName(tier)
        self.name = f"host-{measure}"
        self.emulated = emulated
        self._proc = psutil.Process()
        self._peak = 0

    def _read(self) -> int:
        if self.measure == "uss":
            try:
                return int(self._proc.memory_full_info().uss)
            except (psutil.AccessDenied, AttributeError):
                return int(self._proc.memory_info().rss)
        return int(self._proc.memory_info().rss)

    def sample(self) -> MemorySample:
        used = self._read()
        self._peak = max(self._peak, used)
        return MemorySample(used_bytes=used, peak_bytes=self._peak, emulated=self.emulated)

    def reset_peak(self) -> None:
        self._peak = self._read()

    @staticmethod
    def system_available_bytes() -> int:
        """Memory the OS could give processes now without swapping (``psutil`` ``available``)."""
        return int(psutil.virtual_memory().available)

    @staticmethod
    def system_total_bytes() -> int:
        return int(psutil.virtual_memory().total)
