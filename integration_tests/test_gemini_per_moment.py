"""Gemini's per-moment plan on the emulated accelerator: the warmup step measures non-model bytes
at every moment (memtrace's ``MomentRecorder`` through the contract's ``StepRecorder``), and in
later steps the chunks on the accelerator plus the live non-model bytes stay within the budget at
every moment, while training still equals plain AdamW."""

from __future__ import annotations

import pytest
import torch
from _reference import adamw_losses_and_weights, nano_gpt, token_batches
from _weights import assert_weights_close

from colossal_contracts import TierName
from colossal_memtrace import MomentRecorder
from colossal_zero import GeminiConfig, GeminiOptimizer, apply_gemini

STEPS, BATCH, SEQ, LR = 4, 8, 32, 3e-3


_model = nano_gpt


def _data() -> list[tuple[torch.Tensor, torch.Tensor]]:
    return token_batches(STEPS, BATCH, SEQ, seed=7)


def _gemini(budget: int | None, probe_step: int = 2):  # type: ignore[no-untyped-def]
    """Train; in step ``probe_step`` measure non-model bytes per moment again (without changing
    the plan) and the peak chunk bytes on the accelerator in each moment."""
    plain = _model()
    cfg = GeminiConfig(precision="fp32", accelerator_bytes=budget, chunk_numel=16384)
    gm = apply_gemini(plain, cfg, group=None, recorder=MomentRecorder())
    opt = GeminiOptimizer.from_torch(gm, torch.optim.AdamW(plain.parameters(), lr=LR))
    rt, m = gm.runtime, gm.runtime.manager
    acc = m.books.tiers[TierName.ACCELERATOR]
    peaks: list[int] = []  # chunk bytes: before moment 0, then one per moment
    probing = False
    real = m.set_moment

    def set_moment(moment: int, **kw: int) -> None:
        if probing:  # a moment begins: close the window of the one before
            peaks.append(acc.peak_bytes)
            m.books.reset_peaks()
        real(moment, **kw)

    m.set_moment = set_moment  # type: ignore[method-assign]
    losses, moved = [], []
    for i, (x, y) in enumerate(_data()):
        probing = i == probe_step
        if probing:
            rt.measure_next_step(MomentRecorder())
            m.books.reset_peaks()
        before = m.books.stats().bytes_moved
        loss = gm(x, y)
        opt.backward(loss)
        if probing:
            peaks.append(acc.peak_bytes)
            probing = False
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
        moved.append(m.books.stats().bytes_moved - before)
    return losses, gm.full_state_dict(), moved, rt.measured, peaks


def test_chunks_plus_non_model_bytes_stay_within_the_budget_at_every_moment():
    # how much activation memory this step holds, measured without a budget
    _, _, _, free, _ = _gemini(None, probe_step=1)
    n = free.num_moments()
    non_model = max(free.non_model_peak(i, "accelerator") for i in range(n))
    # room for a few chunks beside the largest activation peak (10% margin): chunks must move
    budget = int(non_model * 1.1) + 4 * 16384 * 4 * 2
    losses, weights, moved, measured, peaks = _gemini(budget)
    assert measured.num_moments() == n and len(peaks) == n + 1
    for i in range(n):
        chunks = max(peaks[0], peaks[1]) if i == 0 else peaks[i + 1]  # moment 0 holds the head
        live = measured.non_model_peak(i, "accelerator")
        assert chunks + live <= budget, f"moment {i}: {chunks:,} + {live:,} > {budget:,}"
    # the plan is per moment: chunks had more room where activations were small
    assert max(peaks) - min(peaks) > 16384 * 4
    assert all(m > 0 for m in moved[1:]), moved
    ref_losses, ref_weights = adamw_losses_and_weights(_model(), _data(), LR)
    assert losses == pytest.approx(ref_losses, rel=1e-5)
    assert_weights_close(weights, ref_weights, rel=1e-5)
