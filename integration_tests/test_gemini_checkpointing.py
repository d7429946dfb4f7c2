"""Activation checkpointing under Gemini ([Note: checkpointed regions] in colossal-zero): a GPT
whose blocks recompute in backward trains as plain AdamW does, with chunks moving under a budget
and with gradient accumulation, and it holds fewer activation bytes than without checkpointing."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import pytest
import torch
from _weights import assert_weights_close

from colossal_memtrace import MomentRecorder
from colossal_models import GPT, GPTConfig, apply_activation_checkpointing
from colossal_zero import GeminiConfig, GeminiOptimizer, apply_gemini

STEPS, LR, NUMEL = 3, 3e-3, 8192
CHUNK = NUMEL * 4  # bytes of one fp32 chunk
CFG = GPTConfig(vocab_size=256, max_seq_len=32, num_layers=3, num_heads=2, hidden_size=32)


def _model(checkpointed: bool) -> GPT:
    torch.manual_seed(0)
    model = GPT(CFG)
    apply_activation_checkpointing(model, enabled=checkpointed)
    return model


def _data(micro: int) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    g = torch.Generator().manual_seed(7)
    return [
        [tuple(torch.randint(0, 256, (2, 4, 32), generator=g)) for _ in range(micro)]  # type: ignore[misc]
        for _ in range(STEPS)
    ]


@dataclass(frozen=True)
class Case:
    name: str
    precision: str = "fp32"
    budget: int | None = None  # accelerator bytes; None: every chunk fits
    micro: int = 1  # micro-batches per step (gradient accumulation)


CASES = [
    Case("fp32"),
    # four param + gradient chunk pairs of eight: chunks are evicted and re-fetched every step,
    # also between a block's forward and its recompute
    Case("fp32 under a budget, accumulation", budget=8 * CHUNK, micro=2),
]


def _gemini(case: Case, checkpointed: bool):  # type: ignore[no-untyped-def]
    model = _model(checkpointed)
    cfg = GeminiConfig(
        precision=case.precision, accelerator_bytes=case.budget, chunk_numel=NUMEL, device="cpu"
    )
    gm = apply_gemini(model, cfg, group=None)
    opt = GeminiOptimizer.from_torch(gm, torch.optim.AdamW(model.parameters(), lr=LR))
    losses, moved = [], []
    for batches in _data(case.micro):
        before = gm.memory_stats().bytes_moved
        for x, y in batches:
            loss = gm(x, y) / case.micro
            opt.backward(loss)
            losses.append(loss.item())
        opt.step()
        opt.zero_grad()
        moved.append(gm.memory_stats().bytes_moved - before)
    return losses, gm.full_state_dict(), moved


def _adamw(case: Case) -> tuple[list[float], dict[str, torch.Tensor]]:
    model = _model(False)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    losses = []
    for batches in _data(case.micro):
        for x, y in batches:
            loss = model(x, y) / case.micro
            loss.backward()
            losses.append(loss.item())
        opt.step()
        opt.zero_grad()
    return losses, copy.deepcopy(model.state_dict())


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_checkpointed_gpt_under_gemini_equals_adamw(case: Case) -> None:
    losses, weights, moved = _gemini(case, checkpointed=True)
    if case.budget is not None:
        assert all(b > 0 for b in moved), moved  # the budget made chunks move every step
    ref_losses, ref_weights = _adamw(case)
    assert losses == pytest.approx(ref_losses, rel=1e-5, abs=1e-6)
    assert_weights_close(weights, ref_weights, rel=1e-5)


def test_checkpointing_under_gemini_is_bit_identical_in_bf16() -> None:
    case = Case("bf16 under a budget", precision="bf16", budget=6 * CHUNK)
    plain_losses, plain_weights, _ = _gemini(case, checkpointed=False)
    losses, weights, _ = _gemini(case, checkpointed=True)
    assert losses == plain_losses
    for k, ref in plain_weights.items():
        assert torch.equal(weights[k], ref), k


def _non_model_peak(checkpointed: bool) -> int:
    """The largest non-model (activation) bytes at any moment of one step after warmup."""
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=256, max_seq_len=64, num_layers=4, num_heads=2, hidden_size=32)
    model = GPT(cfg)
    apply_activation_checkpointing(model, enabled=checkpointed)
    gm = apply_gemini(model, GeminiConfig(precision="fp32", device="cpu"), group=None)
    opt = GeminiOptimizer.from_torch(gm, torch.optim.AdamW(model.parameters(), lr=LR))
    x, y = torch.randint(0, 256, (2, 4, 64), generator=torch.Generator().manual_seed(1))
    for i in range(2):
        if i == 1:
            gm.runtime.measure_next_step(MomentRecorder())
        opt.backward(gm(x, y))
        opt.step()
        opt.zero_grad()
    got = gm.runtime.measured
    return max(got.non_model_peak(i, "accelerator") for i in range(got.num_moments()))


def test_checkpointing_under_gemini_lowers_the_activation_peak() -> None:
    plain, checkpointed = _non_model_peak(False), _non_model_peak(True)
    # four blocks keep only their inputs (one recomputed at a time): well under two thirds
    assert checkpointed < 0.67 * plain, (checkpointed, plain)
