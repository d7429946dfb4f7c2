"""``run_pipeline`` on a toy model with a tied first/last matrix, in the package alone: every
schedule gives the single-rank loss and gradients, the tied gradient is the sum of both uses and
identical on both ranks, and the bytes sent equal the formula."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import _checks_pipeline as checks

CASES = [
    ("gpipe", 4, 1),
    ("1f1b", 4, 1),
    ("1f1b", 8, 1),
    ("interleaved", 2, 2),
    ("interleaved", 4, 4),
]


def test_schedules_give_the_single_rank_gradients(world):
    results = world(2).run(checks.run_schedules, CASES)
    for i, case in enumerate(CASES):
        r0, r1 = results[0][i], results[1][i]
        for r in (r0, r1):
            assert r["loss_err"] < 1e-6, (case, r["loss_err"])
            assert r["grad_err"] < 1e-5, (case, r["grad_err"])
            assert r["sent"] == r["formula"], (case, r["sent"], r["formula"])
            assert r["timeline"] == 2 * case[1] * case[2]  # every forward and backward, once
        assert torch.equal(r0["tied"], r1["tied"]), case
