"""A background thread that polls probes and records the peak between marks."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

from colossal_contracts import ConfigError, MemoryProbe

__all__ = ["SampledWindow", "SamplingTracer"]


@dataclass(frozen=True)
class SampledWindow:
    """What one probe read between two marks.

    Attributes:
        label: the mark that opened the window.
        probe: the probe's name.
        peak_bytes: the highest reading in the window (polled values and the probe's own peak).
        end_bytes: the reading when the window closed.
        num_samples: polls that fell in the window (0 means the window was shorter than the
            interval: the figure then comes from the probe's own peak and end reading only).
    """

    label: str
    probe: str
    peak_bytes: int
    end_bytes: int
    num_samples: int


class SamplingTracer:
    """Polls ``probes`` every ``interval_s`` on a daemon thread; ``mark`` cuts a window.

    Each window's peak is the maximum of the polled readings and of each probe's own
    ``peak_bytes`` at the cut (exact for the CUDA allocator, whose peak is kept by torch), and each
    probe's peak is reset at every mark. Use as a context manager, or ``start``/``stop``.
    """

    def __init__(self, probes: Sequence[MemoryProbe], *, interval_s: float = 0.001):
        if interval_s <= 0:
            raise ConfigError(f"SamplingTracer interval_s must be positive, got {interval_s}")
        if not probes:
            raise ConfigError("SamplingTracer needs at least one probe, e.g. HostProbe()")
        self.probes = list(probes)
        self.interval_s = interval_s
        self.windows: list[SampledWindow] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._label = "start"
        self._peaks = [0] * len(self.probes)
        self._counts = [0] * len(self.probes)
        self.num_polls = 0

    def _poll(self) -> None:
        with self._lock:
            for i, p in enumerate(self.probes):
                used = p.sample().used_bytes
                if used > self._peaks[i]:
                    self._peaks[i] = used
                self._counts[i] += 1
            self.num_polls += 1

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._poll()

    def start(self) -> SamplingTracer:
        if self._thread is not None:
            return self
        for p in self.probes:
            p.reset_peak()
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="memtrace-sampler", daemon=True)
        self._thread.start()
        return self

    def mark(self, label: str) -> list[SampledWindow]:
        """Close the open window (one entry per probe), open one named ``label``."""
        closed = []
        with self._lock:
            for i, p in enumerate(self.probes):
                s = p.sample()
                closed.append(
                    SampledWindow(
                        label=self._label,
                        probe=p.name,
                        peak_bytes=max(self._peaks[i], s.peak_bytes, s.used_bytes),
                        end_bytes=s.used_bytes,
                        num_samples=self._counts[i],
                    )
                )
                p.reset_peak()
                self._peaks[i] = s.used_bytes
                self._counts[i] = 0
            self._label = label
        self.windows.extend(closed)
        return closed

    def stop(self) -> list[SampledWindow]:
        """Stop polling; close the last window and return every window recorded."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            self.mark("stopped")
        return self.windows

    def __enter__(self) -> SamplingTracer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
