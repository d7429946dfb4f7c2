"""GPT and PaLM with sequences split over sp = 2 and 4 (ring attention and Ulysses), and over
dp x sp = 2 x 2: losses, first-step gradients and logits equal the unsharded model within
1e-5, weights after 5 AdamW steps within 1e-4 (see ``WEIGHT_TOL``). Cases are data: (model, method, dp) per world size."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import _checks_models_sp as checks

TOL = 1e-5
# Weights after 5 AdamW steps: ring attention's blockwise softmax differs from the fused
# reference by ~1e-7 in the gradients (checked at 1e-5 on the first step), and AdamW's
# normalisation turns that into up to ~3e-5 on single weights (measured: GPT dp x sp = 2 x 2
# ring 2.5e-5 on one block's MLP output weight, PaLM sp = 2 ring 1.3e-5; the others < 1e-5).
WEIGHT_TOL = 1e-4
CASES = {
    2: [("gpt", "ring", 1), ("gpt", "ulysses", 1), ("palm", "ring", 1)],
    4: [("gpt", "ring", 1), ("gpt", "ulysses", 1), ("gpt", "ring", 2), ("palm", "ulysses", 2)],
}


@pytest.mark.parametrize("size", sorted(CASES))
def test_sequence_split_models_train_like_the_unsharded_one(world, size):
    results = world(size).run(checks.run_cases, CASES[size])
    for i, case in enumerate(CASES[size]):
        name = "/".join(map(str, case))
        for rank, res in enumerate(results):
            r = res[i]
            ref, par = r["losses"]["ref"], r["losses"]["par"]
            assert ref[-1] < ref[0], (name, ref)
            for a, b in zip(par, ref):
                assert abs(a - b) <= TOL * abs(b), (name, rank, par, ref)
            assert r["grad_err"] <= TOL, (name, rank, r["grad_err"])
            assert r["weight_err"] <= WEIGHT_TOL, (name, rank, r["weight_err"])
            assert r["logits_err"] <= TOL, (name, rank, r["logits_err"])
            assert r["sp_bytes"] > 0, name


def test_bad_long_sequence_input_raises_before_any_collective(world):
    for res in world(2).run(checks.plan_errors):
        assert len(res) == 3
        for name, msg in res.items():
            assert msg.startswith("ok (0 collectives)"), (name, msg)
