"""Layout-independent checkpoints of ``HybridParallelPlugin`` (checks in
``_checks_hybrid_checkpoint.py``): trained on one layout, saved at step 5 through
``Booster.save``, resumed on another layout (or in one plain process) and trained on: the
losses equal one uninterrupted single-process AdamW run (clipping on) within 1e-5.
"""

from __future__ import annotations

import math

import pytest
import torch
from _checks_hybrid_checkpoint import LR, batches, hybrid_steps, make_model, plain_steps

from colossal import load_layout_checkpoint
from colossal.booster import read_layout_index

STEPS, SAVE = 10, 5
TP2_PP2 = {"tp_size": 2, "pp_size": 2, "microbatches": 2}
DP4_ZERO1 = {"zero_stage": 1}


def _reference(bias: bool) -> tuple[list[float], torch.nn.Module]:
    model = make_model(bias=bias)
    losses = plain_steps(model, torch.optim.AdamW(model.parameters(), lr=LR), batches(STEPS))
    return losses, model


def _close(got: list[float], want: list[float]) -> float:
    return max(abs(a - b) / abs(b) for a, b in zip(got, want, strict=True))


@pytest.fixture(scope="module")
def tp2_pp2_run(world, tmp_path_factory):
    root = tmp_path_factory.mktemp("tp2pp2")
    out = world(4).run(hybrid_steps, TP2_PP2, str(root), first=0, last=SAVE, bias=False, load=False)
    return root, out[0]


def test_tp2_pp2_resumes_on_dp4_zero1(world, tp2_pp2_run):
    root, first = tp2_pp2_run
    ref, _ = _reference(False)
    assert _close(first, ref[:SAVE]) <= 1e-5
    out = world(4).run(hybrid_steps, DP4_ZERO1, str(root), first=SAVE, last=STEPS, bias=False, load=True)
    assert _close(out[0], ref[SAVE:]) <= 1e-5, (out[0], ref[SAVE:])


def test_tp2_pp2_resumes_in_one_plain_process(tp2_pp2_run):
    root, _ = tp2_pp2_run
    ref, ref_model = _reference(False)
    model = make_model(bias=False, seed=7)
    opt = torch.optim.AdamW(model.parameters(), lr=1.0)  # lr comes from the checkpoint
    load_layout_checkpoint(root / f"step-{SAVE}", model, opt)
    assert opt.param_groups[0]["lr"] == LR
    losses = plain_steps(model, opt, batches(STEPS)[SAVE:])
    assert _close(losses, ref[SAVE:]) <= 1e-5, (losses, ref[SAVE:])


def test_every_element_is_written_once(tp2_pp2_run):
    """The saved blocks of each tensor are disjoint and cover it: the tied embedding (first and
    last stage) and the tp-replicated norms are written once."""
    root, _ = tp2_pp2_run
    index = read_layout_index(root / f"step-{SAVE}")
    model = make_model(bias=False)
    numel = {n: p.numel() for n, p in model.named_parameters()}
    assert set(index["params"]) == set(numel)
    for kind in ("param", "exp_avg", "exp_avg_sq"):
        written = {n: sum(math.prod(b[3]) for b in blocks) for n, blocks in index["tensors"][kind].items()}
        assert written == numel, kind
    assert {b[0] for bl in index["tensors"]["param"].values() for b in bl} == {
        f"layout-{r:05d}-of-00004.safetensors" for r in range(4)
    }
    assert set(index["steps"].values()) == {float(SAVE)}
