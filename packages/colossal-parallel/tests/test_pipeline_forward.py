"""``run_pipeline_forward``: the single-rank loss of the toy model with a tied first/last
matrix (within 1e-6 relative), forward only (no gradient appears), one activation sent per
stage boundary and micro-batch, for one and several chunks per rank (the interleaved layout,
whose forward-only order must not deadlock)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import _checks_pipeline_forward as checks

from colossal_contracts import ConfigError

CASES = [(1, 1), (4, 1), (2, 2), (4, 4)]


def test_forward_only_gives_the_single_rank_loss(world):
    results = world(2).run(checks.run_forward, CASES)
    for i, case in enumerate(CASES):
        for r in (results[0][i], results[1][i]):
            assert r["loss_err"] < 1e-6, (case, r)
            assert not r["any_grad"], case
            assert r["sent"] == r["formula"], (case, r)


def test_a_batch_that_does_not_split_is_refused():
    import torch

    from colossal_parallel.pipeline import run_pipeline_forward

    with pytest.raises(ConfigError, match="cannot be split into 3"):
        run_pipeline_forward(
            [],
            None,
            torch.zeros(4, 2),
            torch.zeros(4, 2),
            num_microbatches=3,
            boundary_shape=(1, 2),
        )
