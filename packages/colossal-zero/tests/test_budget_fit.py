"""Issue 35 items 1-2: chunks shrink to fit the measured non-model reserve; a budget no chunk size
fits is refused right after the warmup with a figure that, followed, trains."""

from __future__ import annotations

import re

import _checks_zero as checks
import pytest
from _zero_model import build, reference

from colossal_contracts import CapacityError
from colossal_memtrace import MomentRecorder
from colossal_zero import GeminiConfig, GeminiOptimizer, apply_gemini
from colossal_zero.gemini._fit import moment_need

STEPS, BATCH = 6, 8
RESERVE = 100_000  # a constant non-model reserve per moment (10% margin on top: 110,000)


def test_moment_need_counts_this_and_the_last_moment_and_gradient_twins_in_backward():
    order = [("a",), ("b",), ("b",), ("a",)]
    chunk_of, size = {"a": 0, "b": 1}, {0: 10, 1: 100}
    assert moment_need(order, 2, chunk_of, size, grad_twin=False) == [10, 110, 100, 110]
    assert moment_need(order, 2, chunk_of, size, grad_twin=True) == [10, 110, 200, 120]


def _assert_equals_adamw(losses: list[float], weights: dict) -> None:
    ref_losses, ref_weights = reference(STEPS, BATCH)
    for a, b in zip(losses, ref_losses, strict=True):
        assert abs(a - b) <= 1e-5 * max(1.0, abs(b))
    for k, v in ref_weights.items():
        assert (weights[k] - v).abs().max().item() <= 1e-5 * max(1.0, v.abs().max().item())


def _recorded(budget: int, steps: int, *, chunk_numel: int) -> list[float]:
    """Train fp32 under ``budget`` with the warmup measuring activations (memtrace's recorder)."""
    cfg = GeminiConfig(precision="fp32", accelerator_bytes=budget, chunk_numel=chunk_numel)
    model = apply_gemini(build(), cfg, recorder=MomentRecorder())
    opt = GeminiOptimizer(model, lr=1e-2)
    return checks.train(model, opt, steps, BATCH)


def _chunk_numel(config: GeminiConfig) -> tuple[list[float], dict, int]:
    model, opt = checks.make(config)
    losses = checks.train(model, opt, STEPS, BATCH)
    return losses, model.full_state_dict(), model.runtime.manager.registry.chunk_numel


def test_chunks_shrink_when_the_chosen_size_leaves_no_room_and_training_stays_exact():
    # a backward moment holds two parameter chunks and one gradient twin: with 16384-element
    # fp32 chunks 110,001 + 3 x 64 KiB = 306,609 bytes, with 8192-element ones 208,305, so the
    # budget below (which the warmup's 100,000-byte reserve and three chunks fit) fits only after
    # halving
    cfg = GeminiConfig(
        precision="fp32", accelerator_bytes=300_000, chunk_numel=16384, non_model_bytes=RESERVE
    )
    losses, weights, numel = _chunk_numel(cfg)
    assert numel == 8192
    _assert_equals_adamw(losses, weights)


def test_a_budget_no_chunk_size_fits_is_refused_after_warmup_and_the_named_budget_trains():
    # the warmup measures the activations (memtrace's recorder); they alone exceed the budget,
    # so no chunk size fits and the refusal comes at the end of the warmup step
    with pytest.raises(CapacityError, match="feasibility rule") as err:
        _recorded(100_000, 1, chunk_numel=4096)
    named = int(re.search(r"at least ([\d,]+) bytes", str(err.value)).group(1).replace(",", ""))
    assert named > 100_000
    assert (
        len(_recorded(named, STEPS, chunk_numel=4096)) == STEPS
    )  # following the message trains: no CapacityError


def test_a_warmup_access_with_no_room_borrows_and_the_chunks_shrink_after_it():
    # 16384-element fp32 chunks: a backward moment of the warmup holds two parameter chunks and a
    # gradient twin (196,608 bytes), more than the 180,000-byte budget; the warmup borrows
    # ([Note: warmup loan] in colossal-chunk) and the rule then halves the chunks; exact training
    cfg = GeminiConfig(
        precision="fp32", accelerator_bytes=180_000, chunk_numel=16384, non_model_bytes=20_000
    )
    losses, weights, numel = _chunk_numel(cfg)
    assert numel == 8192
    _assert_equals_adamw(losses, weights)


def test_a_budget_the_warmup_cannot_hold_is_refused_once_after_it_and_the_named_budget_trains():
    # without the loan the warmup itself refused, naming budgets that knew nothing of the step's
    # activations (196,608 for "this access alone", then a third figure after the next warmup)
    with pytest.raises(CapacityError, match="feasibility rule") as err:
        _recorded(140_000, 1, chunk_numel=16384)
    named = int(re.search(r"at least ([\d,]+) bytes", str(err.value)).group(1).replace(",", ""))
    assert named > 196_608
    assert len(_recorded(named, 3, chunk_numel=16384)) == 3
