"""Gemini on 2 data-parallel ranks under a budget that moves chunks every step, in fp32: the
gradients go into each parameter chunk's gathered buffer and are reduce-scattered from there into
the "grad" chunk's shard (colossal-zero's [Note: gradients in chunks]), so no "grad" chunk is ever
gathered; at every moment of a traced step the chunk bytes on the accelerator (shards and
gathered buffers) plus the live non-model bytes stay within the budget; losses and weights equal
plain AdamW on the whole batch."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from _reference import adamw_losses_and_weights, nano_gpt, token_batches
from _weights import assert_weights_close

from colossal_contracts import TierName
from colossal_memtrace import MomentRecorder
from colossal_zero import GeminiConfig, GeminiOptimizer, apply_gemini

STEPS, BATCH, SEQ, LR, CHUNK = 4, 8, 32, 3e-3, 16384
PROBE = 2  # the traced step: after warmup (0) and the re-pack in first-use order (1)


_model = nano_gpt


def _data() -> list[tuple[torch.Tensor, torch.Tensor]]:
    return token_batches(STEPS, BATCH, SEQ, seed=7)


def gemini_rank(budget: int | None, steps: int = STEPS) -> dict:
    """Runs on every rank with its half of each batch. In step PROBE: the non-model bytes per
    moment (measured again, the plan unchanged), the peak chunk bytes on the accelerator per
    moment, and the "grad" chunks seen gathered at any moment's start or end."""
    rank, world = dist.get_rank(), dist.get_world_size()
    per = BATCH // world
    plain = _model()
    cfg = GeminiConfig(precision="fp32", accelerator_bytes=budget, chunk_numel=CHUNK)
    gm = apply_gemini(plain, cfg, recorder=MomentRecorder())
    opt = GeminiOptimizer.from_torch(gm, torch.optim.AdamW(plain.parameters(), lr=LR))
    rt, m = gm.runtime, gm.runtime.manager
    acc = m.books.tiers[TierName.ACCELERATOR]
    peaks: list[int] = []  # chunk bytes: before moment 0, then one per moment
    gathered_grads: set[int] = set()
    probing = False
    real = m.set_moment

    def grads_gathered() -> None:
        gathered_grads.update(
            c.chunk_id for c in m.chunks.values() if c.kind == "grad" and c.is_gathered
        )

    def set_moment(moment: int, **kw: int) -> None:
        if probing:  # a moment begins: close the window of the one before
            grads_gathered()
            peaks.append(acc.peak_bytes)
            m.books.reset_peaks()
        real(moment, **kw)

    m.set_moment = set_moment  # type: ignore[method-assign]
    losses, moved = [], []
    for i, (x, y) in enumerate(_data()[:steps]):
        probing = i == PROBE
        if probing:
            rt.measure_next_step(MomentRecorder())
            m.books.reset_peaks()
        before = m.books.stats().bytes_moved
        loss = gm(x[rank * per : (rank + 1) * per], y[rank * per : (rank + 1) * per])
        opt.backward(loss)
        if probing:
            grads_gathered()
            peaks.append(acc.peak_bytes)
            probing = False
        opt.step()
        opt.zero_grad()
        t = torch.tensor([loss.item()])
        dist.all_reduce(t)
        losses.append(float(t) / world)
        moved.append(m.books.stats().bytes_moved - before)
    measured = rt.measured
    live = [measured.non_model_peak(i, "accelerator") for i in range(measured.num_moments())]
    return {
        "losses": losses,
        "weights": gm.full_state_dict(),
        "moved": moved,
        "live": live,
        "peaks": peaks,
        "gathered_grads": sorted(gathered_grads),
        "has_grad_chunks": any(c.kind == "grad" for c in m.chunks.values()),
    }


def test_two_ranks_under_a_budget_match_adamw_and_hold_the_budget_at_every_moment(world):
    free = world(2).run(gemini_rank, None, PROBE + 1)[0]  # measures, nothing else
    # room for a few chunks (shard + gathered buffer each) beside the largest activation peak
    budget = int(max(free["live"]) * 1.1) + 4 * CHUNK * 4
    ref_losses, ref_weights = adamw_losses_and_weights(_model(), _data(), LR)
    for r, out in enumerate(world(2).run(gemini_rank, budget)):
        n = len(out["live"])
        assert len(out["peaks"]) == n + 1
        for i in range(n):
            chunks = max(out["peaks"][:2]) if i == 0 else out["peaks"][i + 1]
            assert chunks + out["live"][i] <= budget, (
                f"rank {r} moment {i}: {chunks:,} + {out['live'][i]:,} > {budget:,}"
            )
        assert out["has_grad_chunks"] and out["gathered_grads"] == []
        assert all(m > 0 for m in out["moved"][1:]), out["moved"]
        assert out["losses"] == pytest.approx(ref_losses, rel=1e-5)
        assert_weights_close(out["weights"], ref_weights, rel=1e-5, label=f"rank {r}: ")
