"""The sampling tracer catches peaks between marks."""

import threading

import pytest

from colossal_contracts import ConfigError, MemorySample, TierName
from colossal_memtrace import HostProbe, SamplingTracer


class _Dial:
    """A probe whose reading the test sets; counts how often it was read."""

    name = "dial"
    tier = TierName.HOST

    def __init__(self):
        self.value = 0
        self.reads = 0
        self.polled = threading.Event()

    def sample(self):
        self.reads += 1
        if self.reads > 3:
            self.polled.set()
        return MemorySample(self.value, self.value)

    def reset_peak(self):
        pass


def _wait_for_polls(dial):
    dial.reads, dial.polled = 0, threading.Event()
    assert dial.polled.wait(30), "the sampler thread never polled"


def test_peak_between_marks_is_recorded():
    dial = _Dial()
    with SamplingTracer([dial], interval_s=0.0005) as tracer:
        dial.value = 500
        _wait_for_polls(dial)
        dial.value = 100
        first = tracer.mark("second")
        _wait_for_polls(dial)
        dial.value = 50
    windows = tracer.windows
    assert first[0].label == "start" and first[0].peak_bytes == 500 and first[0].end_bytes == 100
    assert windows[1].label == "second" and windows[1].peak_bytes == 100
    assert windows[1].end_bytes == 50 and windows[1].num_samples > 0


def test_host_probe_sampling_runs_and_bad_settings_are_named():
    with SamplingTracer([HostProbe()], interval_s=0.001) as tracer:
        buf = bytearray(8 << 20)
        tracer.mark("after")
    assert [w.label for w in tracer.windows] == ["start", "after"]
    assert tracer.windows[0].peak_bytes > 0 and len(buf) > 0
    with pytest.raises(ConfigError, match="interval_s"):
        SamplingTracer([HostProbe()], interval_s=0)
    with pytest.raises(ConfigError, match="at least one probe"):
        SamplingTracer([])
