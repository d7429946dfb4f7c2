"""MomentRecorder: the runtime cuts moments, the recorder measures non-model bytes in each."""

import torch

from colossal_contracts import MemStatsSource, StepRecorder
from colossal_memtrace import MomentRecorder


def test_moments_hold_exact_live_non_model_bytes_and_the_compute_order():
    model = torch.zeros(1000)  # 4000 bytes of "chunk" payload the runtime reports as model data
    rec = MomentRecorder("cpu")
    assert isinstance(rec, StepRecorder)
    rec.start(lambda tier: 4000 if tier.value == "host" else 0, [model])
    rec.cut(("a",))
    x = torch.ones(256)  # 1 KiB activation, alive into moment 1
    rec.cut(("b", "c"))
    y = x * 2  # another KiB
    del x
    rec.cut(("a",))
    del y
    stats = rec.finish()
    rec.close()
    assert isinstance(stats, MemStatsSource)
    assert stats.compute_order() == [("a",), ("b", "c"), ("a",)]
    assert [stats.non_model_peak(i, "accelerator") for i in range(3)] == [1024, 2048, 1024]
    assert torch.ones(3).sum() == 3  # the recorder's dispatch mode is gone after close
