"""2D (SUMMA, q=2 on 4 ranks), 2.5D (Tesseract, q=2 and d=2 on 8 ranks) and 3D (q=2 cube on 8
ranks, both activation layouts): values, gradients, counted bytes, errors and training.

One table of modes (``MODES``; sizes in ``_checks_tp_multid.KITS``). Every check of a mode runs
inside one ``world(n).run`` call (spawning ranks is the slow part); the tests assert on its results.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import _checks_tp_multid as checks

MODES = ["2d", "2.5d", "3d"]
TOL = 1e-5  # fp32 relative error allowed against the unsharded reference


@pytest.fixture(scope="module", params=MODES)
def mode(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def layer_results(world, mode):
    return world(checks.num_ranks(mode)).run(checks.run_layers, mode)


@pytest.fixture(scope="module")
def training_results(world, mode):
    return world(checks.num_ranks(mode)).run(checks.run_training, mode)


def _layers(res: dict) -> dict:
    layers = {k: v for k, v in res.items() if isinstance(v, dict) and "err" in v}
    assert len(layers) >= 6, layers.keys()
    return layers


def test_layers_match_unsharded_reference(layer_results):
    for rank, res in enumerate(layer_results):
        for name, r in _layers(res).items():
            worst = max(r["err"].values())
            assert worst <= TOL, f"rank {rank} {name}: {r['err']}"
        assert res["roundtrip"] == 0.0


def test_counted_bytes_equal_formulas(layer_results):
    for rank, res in enumerate(layer_results):
        for name, r in _layers(res).items():
            assert r["bytes"] == r["formula"], f"rank {rank} {name}: {r['bytes']} vs {r['formula']}"
            assert r["bytes"][0] > 0, f"rank {rank} {name}: nothing counted"


def test_invalid_sizes_raise_before_any_collective(layer_results):
    for rank, res in enumerate(layer_results):
        bad = {k: v for k, v in res["errors"].items() if not v.startswith("ok (0 collectives)")}
        assert not bad, f"rank {rank}: {bad}"


def test_two_block_transformer_trains_like_single_process(training_results):
    for rank, res in enumerate(training_results):
        ref, par = res["ref"], res["par"]
        assert len(ref) == len(par) == 5
        assert ref[-1] < ref[0], f"the reference did not learn: {ref}"
        for step, (a, b) in enumerate(zip(par, ref)):
            assert abs(a - b) <= TOL * abs(b), f"rank {rank} step {step}: {a} vs {b}"
        assert res["weight_err"] <= 1e-4, f"rank {rank}: trained shards differ {res['weight_err']}"
        assert res["params_local"] < res["params_ref"]
