"""MomentRecorder: the runtime cuts moments, the recorder measures non-model bytes in each."""

import threading

import torch

from colossal_contracts import ConfigError, MemStatsSource, StepRecorder
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


def test_two_recorders_closed_out_of_order_leave_the_other_active():
    """Two runtimes stepped alternately: each recorder is stopped at its step's end and closed at
    its runtime's next forward, so the first closes while the second's mode is above it."""
    from torch.utils._python_dispatch import (
        _get_current_dispatch_mode_stack,
        is_in_torch_dispatch_mode,
    )

    a, b = MomentRecorder("cpu"), MomentRecorder("cpu")
    none = lambda tier: 0  # noqa: E731
    a.start(none, [])
    a.cut(("a",))
    a.finish()
    b.start(none, [])
    b.cut(("b",))
    b.finish()
    a.close()  # below b's mode
    assert len(_get_current_dispatch_mode_stack()) == 1
    a.start(none, [])  # a's next step, above b's stopped mode
    a.cut(("a",))
    x = torch.ones(256)
    a.cut(("a",))
    stats = a.finish()
    assert stats.non_model_peak(0, "accelerator") == 1024  # measured while b's mode is below
    b.close()
    a.close()
    del x
    assert _get_current_dispatch_mode_stack() == []
    assert not is_in_torch_dispatch_mode()  # each mode restored the flags it saved


def test_closing_on_another_thread_is_refused_and_the_recorder_stays_open():
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    rec = MomentRecorder("cpu")
    rec.start(lambda tier: 0, [])
    rec.cut(("a",))
    rec.finish()
    errors: list[BaseException] = []

    def close_elsewhere() -> None:
        try:
            rec.close()
        except BaseException as err:  # handed to the main thread
            errors.append(err)

    t = threading.Thread(target=close_elsewhere)
    t.start()
    t.join()
    assert len(errors) == 1 and isinstance(errors[0], ConfigError)
    assert "thread that started it" in str(errors[0])
    assert len(_get_current_dispatch_mode_stack()) == 1  # still here, on this thread
    rec.close()
    assert _get_current_dispatch_mode_stack() == []
