"""CountedComm results against a single-process reference, and the byte convention of CommCounter."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from colossal_parallel import CommCounter, CommStat, MeshConfig

sys.path.insert(0, str(Path(__file__).parent))
import _checks_parallel_mesh as checks

F32 = 4


def _t(rank: int) -> torch.Tensor:
    return torch.arange(6, dtype=torch.float32).reshape(2, 3) + 10 * rank


CASES = [
    (2, MeshConfig(tp=2), "tp"),
    (4, MeshConfig(tp=4), "tp"),
    (4, MeshConfig(dp=2, tp=2), "dp"),
    (8, MeshConfig(tp=8, tp_mode="3d"), "tp_wt"),
    (8, MeshConfig(tp=8, tp_mode="2.5d", tp_depth=2), "tp_row"),
    (8, MeshConfig(tp=8, tp_mode="2.5d", tp_depth=2), "tp"),
]


@pytest.mark.parametrize(("n", "cfg", "axis"), CASES, ids=[f"{n}-{a}" for n, _, a in CASES])
def test_collectives_match_reference(world, n, cfg, axis):
    results = world(n).run(checks.collectives, cfg, axis)
    for res in results:
        members, p, c = res["ranks"], res["size"], res["coord"]
        ts = [_t(r) for r in members]
        torch.testing.assert_close(res["all_reduce"], sum(ts), rtol=0, atol=0)
        torch.testing.assert_close(res["all_reduce_max"], torch.stack(ts).amax(0), rtol=0, atol=0)
        torch.testing.assert_close(res["all_gather0"], torch.cat(ts, 0), rtol=0, atol=0)
        torch.testing.assert_close(res["all_gather1"], torch.cat(ts, 1), rtol=0, atol=0)
        bigs = [torch.arange(4.0 * p * 3).reshape(4 * p, 3) + r for r in members]
        torch.testing.assert_close(res["reduce_scatter0"], sum(bigs).chunk(p, 0)[c], rtol=0, atol=0)
        torch.testing.assert_close(
            res["reduce_scatter1"], sum(bigs).t().chunk(p, 1)[c], rtol=0, atol=0
        )
        torch.testing.assert_close(res["broadcast"], ts[-1], rtol=0, atol=0)
        if c == 0:
            torch.testing.assert_close(res["reduce"], sum(ts), rtol=0, atol=0)
        a2as = [torch.arange(2.0 * p * 5).reshape(2 * p, 5) + 100 * r for r in members]
        want = torch.cat([a.chunk(p, 0)[c] for a in a2as], dim=1)
        torch.testing.assert_close(res["all_to_all"], want, rtol=0, atol=0)
        assert res["input_untouched"]

        # [Note: counted bytes]: full logical tensor per device
        tb = 6 * F32
        want_bytes = {
            "all_reduce": 2 * tb,  # two calls (sum, max)
            "all_gather": 2 * p * tb,  # output bytes, two calls
            "reduce_scatter": 2 * 4 * p * 3 * F32,  # input bytes, two calls
            "broadcast": tb,
            "reduce": tb,
            "all_to_all": 2 * p * 5 * F32,
        }
        calls = {"all_reduce": 2, "all_gather": 2, "reduce_scatter": 2}
        assert res["counter"] == {
            (axis, op): CommStat(calls.get(op, 1), b) for op, b in want_bytes.items()
        }
        assert res["total_bytes"] == res["axis_bytes"] == sum(want_bytes.values())
        assert res["calls"] == 9
        assert res["after_reset"] == 0


def test_size_one_axis_is_free(world):
    res = world(2).run(checks.collectives, MeshConfig(dp=2), "tp")[0]
    assert res["size"] == 1
    torch.testing.assert_close(res["all_reduce"], _t(res["ranks"][0]))
    assert res["total_bytes"] == 0 and res["calls"] == 0


@pytest.mark.parametrize("n", [2, 4])
def test_autograd_collectives(world, n):
    results = world(n).run(checks.autograd_ops, MeshConfig(tp=n), "tp")
    p = n
    xs = [torch.arange(2.0 * 2 * p).reshape(2, 2 * p) + r for r in range(p)]
    ws = {
        name: [res[name]["w"] for res in results]
        for name in results[0]
        if name not in ("coord", "size")
    }
    xb = 2 * 2 * p * F32  # bytes of one x
    for r, res in enumerate(results):
        # forward values
        torch.testing.assert_close(res["copy"]["y"], xs[r])
        torch.testing.assert_close(res["reduce"]["y"], sum(xs))
        torch.testing.assert_close(res["split"]["y"], xs[r].chunk(p, 1)[r])
        torch.testing.assert_close(res["gather"]["y"], torch.cat(xs, 1))
        torch.testing.assert_close(res["rs"]["y"], sum(xs).chunk(p, 1)[r])
        # gradients of sum_r (y_r * w_r) w.r.t. x_r
        torch.testing.assert_close(res["copy"]["grad"], sum(ws["copy"]))
        torch.testing.assert_close(res["reduce"]["grad"], ws["reduce"][r])
        torch.testing.assert_close(res["split"]["grad"], torch.cat(ws["split"], 1))
        torch.testing.assert_close(res["gather"]["grad"], ws["gather"][r].chunk(p, 1)[r])
        torch.testing.assert_close(res["gather_rs"]["grad"], sum(ws["gather_rs"]).chunk(p, 1)[r])
        torch.testing.assert_close(res["rs"]["grad"], torch.cat(ws["rs"], 1))
        # counted bytes of forward and backward
        assert res["copy"]["fwd"] == {}
        assert res["copy"]["total"] == {("tp", "all_reduce"): CommStat(1, xb)}
        assert res["reduce"]["total"] == {("tp", "all_reduce"): CommStat(1, xb)}
        assert res["split"]["fwd"] == {}
        assert res["split"]["total"] == {("tp", "all_gather"): CommStat(1, xb)}
        assert res["gather"]["total"] == {("tp", "all_gather"): CommStat(1, p * xb)}
        assert res["gather_rs"]["total"] == {
            ("tp", "all_gather"): CommStat(1, p * xb),
            ("tp", "reduce_scatter"): CommStat(1, p * xb),
        }
        assert res["rs"]["total"] == {
            ("tp", "reduce_scatter"): CommStat(1, xb),
            ("tp", "all_gather"): CommStat(1, xb),
        }


def test_counter_filters():
    c = CommCounter()
    c.record("tp", "all_reduce", 10)
    c.record("tp", "all_reduce", 5)
    c.record("dp", "all_gather", 7)
    assert c.bytes() == 22 and c.calls() == 3
    assert c.bytes(axis="tp") == 15 and c.calls(axis="tp") == 2
    assert c.bytes(op="all_gather") == 7
    assert c.bytes(axis="dp", op="all_reduce") == 0
    assert c.snapshot()[("tp", "all_reduce")] == CommStat(2, 15)
    c.reset()
    assert c.snapshot() == {}
