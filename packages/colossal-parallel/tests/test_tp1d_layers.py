"""1D layers (and their sequence-parallel variants) on 2 and 4 ranks against unsharded modules:
outputs and input/weight gradients within 1e-5 relative error, and counted bytes equal to the
formulas of docs/parallel/1d.md and docs/parallel/sequence.md."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from colossal_parallel import CommStat

sys.path.insert(0, str(Path(__file__).parent))
import _checks_parallel_tp1d as checks

TOL = 1e-5
N = checks.B * checks.S  # tokens
H, OUT = checks.H, checks.OUT
F32 = 4


def _s(**ops: tuple[int, int]) -> dict[tuple[str, str], CommStat]:
    return {("tp", op): CommStat(calls, nbytes) for op, (calls, nbytes) in ops.items()}


# (forward, forward + backward) counted bytes per layer: the formulas of docs/parallel/1d.md
FORMULAS_1D = {
    "column": (_s(), _s(all_reduce=(1, N * H * F32))),
    "column_gather": (
        _s(all_gather=(1, N * OUT * F32)),
        _s(all_gather=(1, N * OUT * F32), all_reduce=(1, N * H * F32)),
    ),
    "row_full_input": (
        _s(all_reduce=(1, N * OUT * F32)),
        _s(all_reduce=(1, N * OUT * F32), all_gather=(1, N * H * F32)),
    ),
    "row": (_s(all_reduce=(1, N * H * F32)), _s(all_reduce=(1, N * H * F32))),
    "layernorm": (_s(), _s()),
    "vocab_embedding": (_s(all_reduce=(1, N * H * F32)), _s(all_reduce=(1, N * H * F32))),
    "embedding": (_s(all_gather=(1, N * H * F32)), _s(all_gather=(1, N * H * F32))),
}
# ... and of docs/parallel/sequence.md
FORMULAS_SP = {
    "column": (
        _s(all_gather=(1, N * H * F32)),
        _s(all_gather=(1, N * H * F32), reduce_scatter=(1, N * H * F32)),
    ),
    "row": (
        _s(reduce_scatter=(1, N * H * F32)),
        _s(reduce_scatter=(1, N * H * F32), all_gather=(1, N * H * F32), all_reduce=(1, H * F32)),
    ),
    "layernorm": (_s(), _s(all_reduce=(2, 2 * H * F32))),
    "vocab_embedding": (
        _s(reduce_scatter=(1, N * H * F32)),
        _s(reduce_scatter=(1, N * H * F32), all_gather=(1, N * H * F32)),
    ),
}


@pytest.mark.parametrize("sp", [False, True], ids=["1d", "1d+sp"])
@pytest.mark.parametrize("n", [2, 4])
def test_layers_match_unsharded(world, n, sp):
    results = world(n).run(checks.layer_checks, sp)
    formulas = FORMULAS_SP if sp else FORMULAS_1D
    for rank, res in enumerate(results):
        assert set(formulas) | {"lm_head_ce", "sequence_helpers"} == set(res)
        for layer, r in res.items():
            for what, err in r["errs"].items():
                assert err <= TOL, f"rank {rank} {layer} {what}: relative error {err:.2e}"
        for layer, (fwd, total) in formulas.items():
            assert res[layer]["fwd"] == fwd, (rank, layer)
            assert res[layer]["total"] == total, (rank, layer)
        head = res["lm_head_ce"]
        assert head["fwd"] == (_s(all_gather=(1, N * H * F32)) if sp else _s())
        assert head["ce_fwd"] == _s(all_reduce=(3, 3 * N * F32))  # max, target logit, sum(exp)
        assert res["sequence_helpers"]["total"] == _s(all_gather=(2, 2 * N * H * F32))


def test_bad_sizes_raise_before_communication(world):
    for msgs in world(2).run(checks.bad_sizes):
        assert msgs.pop("calls") == "0" and msgs.pop("world") == "2"
        for name, msg in msgs.items():
            assert msg, f"{name}: no error for an indivisible size"
        assert "out_features" in msgs["column"] and "multiple of 2" in msgs["column"]
        assert "in_features" in msgs["row"]
        assert "num_embeddings" in msgs["vocab"]
        assert "embedding_dim" in msgs["embedding"]
        assert "sequence length" in msgs["sequence"]
        assert "unknown mesh axis" in msgs["axis"]
        assert "divisible by 2" in msgs["reduce_scatter"] and "divisible by 2" in msgs["all_to_all"]
        assert "disagree" in msgs["cross_entropy"]
