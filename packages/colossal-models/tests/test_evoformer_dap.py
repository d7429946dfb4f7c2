"""Dynamic axial parallelism on 2 and 4 ranks equals the single-process Evoformer (fp32)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from colossal_models.evoformer import dap_comm_bytes

sys.path.insert(0, str(Path(__file__).parent))
import _checks_evoformer as checks

TOL = 1e-5


def _close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    err = float((got - want).abs().max())
    assert err <= TOL * max(1.0, float(want.abs().max())), f"{what}: max error {err}"


@pytest.fixture(scope="module")
def reference() -> dict:
    return checks.run(checks.model())


@pytest.mark.parametrize(("p", "chunk"), [(2, None), (4, None), (2, 3)])
def test_dap_equals_single_process(world, reference, p, chunk):
    for res in world(p).run(checks.dap_rank, p, chunk):
        for k in ("m", "z", "s", "grad_m", "grad_z"):
            _close(res[k], reference[k], k)
        assert res["params"].keys() == reference["params"].keys()
        for name, g in reference["params"].items():
            _close(res["params"][name], g, name)
        shape = dict(batch=checks.B, num_seq=checks.S, num_res=checks.R, p=p)
        assert res["fwd_bytes"] == dap_comm_bytes(checks.CFG, **shape)
        assert res["all_bytes"] == dap_comm_bytes(checks.CFG, **shape, backward=True)


def test_dap_rejects_indivisible_shapes_before_communicating(world):
    msgs = world(4).run(checks.dap_bad_shapes, 4)[0]
    assert msgs[-1] == "calls=0"
    assert len(msgs) == 4
    for m in msgs[:2]:
        assert m.startswith("ConfigError") and "\n" not in m and "divisible by 4" in m
    assert msgs[2].startswith("ConfigError") and "already parallelized" in msgs[2]


def test_dap_composes_with_data_parallelism(world):
    want = checks.reference_batch2()
    for grads in world(4).run(checks.dap_with_dp_rank):
        for name, g in want.items():
            _close(grads[name], g, name)
