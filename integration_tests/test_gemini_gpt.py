"""The GPT preset trained with Gemini under a budget that forces chunk moves every step, on 1, 2
and 4 data-parallel ranks, against plain PyTorch AdamW on one process with the same global batch."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from _reference import adamw_losses_and_weights, nano_gpt, token_batches
from _weights import assert_weights_close

from colossal_zero import GeminiConfig, GeminiOptimizer, apply_gemini

STEPS, BATCH, SEQ = 10, 8, 32
CFG = GeminiConfig(precision="fp32", accelerator_bytes=400_000, chunk_numel=16384)


_model = nano_gpt


def _data() -> list[tuple[torch.Tensor, torch.Tensor]]:
    return token_batches(STEPS, BATCH, SEQ, seed=3)


def gemini_rank(config: GeminiConfig) -> tuple[list[float], dict[str, torch.Tensor], list[int]]:
    """Runs on every rank: this rank's rows of each global batch; global mean loss per step."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    per = BATCH // world
    plain = _model()
    opt = torch.optim.AdamW(plain.parameters(), lr=3e-3)
    gm = apply_gemini(plain, config)
    gopt = GeminiOptimizer.from_torch(gm, opt)
    losses, moved, last = [], [], 0
    for x, y in _data():
        loss = gm(x[rank * per : (rank + 1) * per], y[rank * per : (rank + 1) * per])
        gopt.backward(loss)
        gopt.step()
        gopt.zero_grad()
        t = torch.tensor([loss.item()])
        if world > 1:
            dist.all_reduce(t)
        losses.append(float(t) / world)
        total = gm.memory_stats().bytes_moved
        moved.append(total - last)
        last = total
    return losses, gm.full_state_dict(), moved


@pytest.mark.parametrize("n", [1, 2, 4])
def test_gpt_fp32_equals_plain_adamw_on_1_2_4_ranks(world, n):
    ref_losses, ref_weights = adamw_losses_and_weights(_model(), _data(), 3e-3)
    runs = [gemini_rank(CFG)] if n == 1 else world(n).run(gemini_rank, CFG)
    for losses, weights, moved in runs:
        for got, want in zip(losses, ref_losses, strict=True):
            assert abs(got - want) <= 1e-5 * abs(want)
        assert_weights_close(weights, ref_weights, rel=1e-5, key_atol=1e-3)
        assert all(m > 0 for m in moved)  # the budget forced moves in every step


def test_gpt_bf16_within_autocast_tolerance():
    ref_losses, _ = adamw_losses_and_weights(_model(), _data(), 3e-3, autocast=True)
    losses, _, _ = gemini_rank(GeminiConfig(precision="bf16", accelerator_bytes=200_000))
    for got, want in zip(losses, ref_losses, strict=True):
        assert abs(got - want) <= 3e-2 * abs(want)
