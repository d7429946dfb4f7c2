"""[Note: collective latency]: each collective a layout runs adds the hardware's per-rank
latency times its group's ranks but one, by kind, beside its bytes."""

from __future__ import annotations

import pytest

from colossal.plan import HARDWARE, Layout, device_memory, model_shape, step_cost
from colossal.plan._calls import collective_calls

SHAPE = model_shape("gpt", "nano")


@pytest.mark.parametrize(
    "lay,group",
    [
        (Layout(1, 1, 4, "2d", 1, "ddp", 8, 1, "none"), 2),
        (Layout(2, 1, 2, "1d-sp", 1, "zero1", 4, 1, "none"), 2),
        (Layout(2, 1, 1, "1d", 2, "ddp", 4, 1, "none", sp_kind="ulysses"), 2),
        (Layout(2, 2, 1, "1d", 1, "ddp", 1, 4, "none"), 2),
    ],
)
def test_latency_adds_per_collective(lay, group):
    hw = HARDWARE["a100-80g"]
    mem = device_memory(SHAPE, lay, 128)
    base = step_cost(SHAPE, lay, mem, hw, 128)
    lat = step_cost(SHAPE, lay, mem, hw.with_(collective_latency=1e-3), 128)
    tp, sp, pp, dp = collective_calls(SHAPE, lay)
    slots = lay.num_micro + lay.pp - 1
    want = 1e-3 * (slots * (tp + sp) * (group - 1) + slots * pp + dp * (lay.dp - 1))
    assert lat.step - base.step == pytest.approx(want)
    assert tp + sp + pp > 0


def test_grid_runs_more_collectives_than_megatron():
    grid = collective_calls(SHAPE, Layout(1, 1, 4, "2d", 1, "ddp", 8, 1, "none"))[0]
    megatron = collective_calls(SHAPE, Layout(1, 1, 4, "1d", 1, "ddp", 8, 1, "none"))[0]
    assert grid == SHAPE.layers * (4 * (2 * 2 + 4 * 2 + 2) + 2 * 8) > megatron == 4 * SHAPE.layers


def test_oversubscribed_cpu_ranks_pay_no_bubble():
    # 4 CPU ranks on 2 cores: a rank idle in the 1F1B bubble hands its core to the others, so a
    # step is m micro-batch slots, not m + pp - 1; a profile says so when ranks outnumber cores
    from colossal.plan._calibrate import profile_hardware

    lay = Layout(2, 2, 1, "1d", 1, "ddp", 1, 4, "none")
    prof = {"flops": {"fp32": 1e9}, "collective_bw": 1e8, "copy_bw": 1e9, "memory": 1 << 30}
    prof.update(disk_write_bw=1e8, disk_read_bw=1e8, device="cpu", world=4)
    shared = profile_hardware({**prof, "cpu_cores": 2}, precision="fp32", name="p")
    alone = profile_hardware({**prof, "cpu_cores": 8}, precision="fp32", name="p")
    assert shared.oversubscribed and not alone.oversubscribed
    mem = device_memory(SHAPE, lay, 128, precision="fp32")
    a, b = (step_cost(SHAPE, lay, mem, hw, 128).compute for hw in (shared, alone))
    assert a / b == pytest.approx(4 / 5)
