"""Probes: host through psutil, CUDA through stand-ins for torch.cuda and pynvml, and on a GPU."""

import warnings
from types import SimpleNamespace

import pytest
import torch

from colossal_contracts import ConfigError, MemoryProbe, TierName
from colossal_memtrace import CudaProbe, HostProbe, LiveTensorProbe, LiveTensorTracker


def test_probes_satisfy_the_contract():
    assert isinstance(HostProbe(), MemoryProbe)
    assert isinstance(LiveTensorProbe(LiveTensorTracker()), MemoryProbe)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert isinstance(CudaProbe(cuda=_FakeCuda(available=False)), MemoryProbe)


def test_host_probe_reads_and_keeps_peak():
    p = HostProbe()
    s = p.sample()
    assert s.used_bytes > 0 and s.peak_bytes >= s.used_bytes and p.tier is TierName.HOST
    assert HostProbe("uss").sample().used_bytes > 0
    assert 0 < HostProbe.system_available_bytes() <= HostProbe.system_total_bytes()
    with pytest.raises(ConfigError, match="'rss' or 'uss'"):
        HostProbe("vms")  # type: ignore[arg-type]


class _FakeCuda:
    def __init__(self, available=True, allocated=1000, reserved=4096, peak=3000):
        self.available, self.allocated, self.reserved, self.peak = (
            available,
            allocated,
            reserved,
            peak,
        )
        self.resets = self.inits = 0

    def init(self):  # torch.cuda.init: the allocator's counters exist only after it
        self.inits += 1

    def is_available(self):
        return self.available

    def device_count(self):
        return 1 if self.available else 0

    def memory_allocated(self, d):
        return self.allocated

    def memory_reserved(self, d):
        return self.reserved

    def max_memory_allocated(self, d):
        return self.peak

    def reset_peak_memory_stats(self, d):
        self.resets += 1
        self.peak = self.allocated

    def get_device_properties(self, d):
        return SimpleNamespace(total_memory=1 << 30)


class _FakeNvml:
    def __init__(self, fail=False):
        self.fail = fail

    def nvmlInit(self):
        if self.fail:
            raise RuntimeError("driver not loaded")

    def nvmlDeviceGetHandleByIndex(self, i):
        return ("handle", i)

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(used=10_000, total=1 << 31)


def test_cuda_probe_with_allocator_and_nvml():
    cuda = _FakeCuda()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to report
        p = CudaProbe(cuda=cuda, nvml=_FakeNvml())
    s = p.sample()
    assert (s.used_bytes, s.peak_bytes, s.emulated) == (1000, 3000, False)
    d = p.detail()
    assert d.reserved == 4096 and d.device_used == 10_000 and d.device_total == 1 << 31
    assert d.outside_allocator == 10_000 - 4096  # the context and other processes
    p.reset_peak()
    assert cuda.resets == 1 and p.sample().peak_bytes == 1000
    assert cuda.inits == 1  # initialised at construction, before any counter is read or reset


@pytest.mark.parametrize("nvml", [None, _FakeNvml(fail=True)])
def test_cuda_probe_without_nvml_reports_once_and_uses_allocator(nvml):
    with pytest.warns(RuntimeWarning, match="NVML|pynvml") as rec:
        p = CudaProbe(cuda=_FakeCuda(), nvml=nvml)
    assert len(rec) == 1 and len(p.notes) == 1
    d = p.detail()
    assert d.device_used is None and d.outside_allocator is None and d.device_total == 1 << 30
    assert p.sample().used_bytes == 1000


def test_cuda_probe_without_gpu_falls_back_and_never_raises():
    with pytest.warns(RuntimeWarning, match="no CUDA device 0 is available") as rec:
        p = CudaProbe(cuda=_FakeCuda(available=False))
    assert len(rec) == 1
    s = p.sample()
    assert s.emulated and s.used_bytes > 0  # host RSS standing in
    assert p.detail() is None and p.emulated
    p.reset_peak()
    tracker = LiveTensorTracker("cpu")
    with pytest.warns(RuntimeWarning):
        q = CudaProbe(cuda=_FakeCuda(available=False), fallback=LiveTensorProbe(tracker))
    with tracker:
        x = torch.empty(64)
        assert q.sample().used_bytes == 256 and x.numel() == 64
    tracker.close()


@pytest.mark.gpu
def test_cuda_probe_on_a_real_gpu():
    p = CudaProbe(0)
    p.reset_peak()
    before = p.sample().used_bytes
    x = torch.empty(1 << 20, device="cuda")  # 4 MiB
    s = p.sample()
    assert s.used_bytes - before >= 4 << 20 and s.peak_bytes >= s.used_bytes
    d = p.detail()
    assert d.reserved >= d.allocated and d.device_total > 0
    del x


@pytest.mark.gpu
def test_live_tracker_on_a_real_gpu_matches_allocator():
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    with LiveTensorTracker("cuda") as tr:
        a = torch.empty(1 << 18, device="cuda")
        b = a * 2
        assert tr.used_bytes(TierName.ACCELERATOR) == torch.cuda.memory_allocated() - base
        del a, b
    tr.close()
