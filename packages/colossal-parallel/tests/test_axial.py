"""The axis switch of dynamic axial parallelism against a single-process reference."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
import _checks_parallel_axial as checks

F32 = 4


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("p", [2, 4])
def test_switch_moves_the_sharded_dim_and_its_gradient(world, p, use_async):
    x, w = checks.full_input(), checks.weights()
    for res in world(p).run(checks.switch_roundtrip, p, use_async):
        c = res["coord"]
        # after the switch: every row, this rank's columns
        torch.testing.assert_close(res["cols"], x.chunk(p, dim=2)[c], rtol=0, atol=0)
        torch.testing.assert_close(res["y"], x * w, rtol=0, atol=0)
        torch.testing.assert_close(res["grad"], w, rtol=0, atol=0)
        local = x.numel() * F32 // p  # [Note: axis switch]: local input bytes per switch
        assert res["fwd_a2a"] == local
        assert res["both_a2a"] == 2 * local
        assert res["bwd_a2a"] == 2 * local
        assert res["a2a_calls"] == 4


def test_switch_errors_are_config_errors_before_communication(world):
    msgs = world(2).run(checks.switch_errors, 2)[0]
    assert msgs[-1] == "calls=0"
    errors = msgs[:-1]
    assert len(errors) == 6
    assert all(m.startswith("ConfigError") and "\n" not in m for m in errors), errors
    assert "divisible by 2" in errors[-1]


def test_async_switch_overlaps_backward_too(world):
    log = world(2).run(checks.async_backward_order, 2)[0]
    assert log == ["_FinishBackward", "work between", "_StartBackward"], log
