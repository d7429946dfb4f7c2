"""Each parameter chunk's gradient state lives on its record (colossal-chunk's ``ChunkGroup``,
[Note: one record per chunk]): reduced after backward, accumulated across micro-batches, empty
after the step, whether gradients were kept ([Note: kept gradients]) or reduced into chunks."""

from __future__ import annotations

import pytest
from _zero_model import batches, build, param_groups

from colossal_chunk import GradPhase
from colossal_zero import GeminiConfig, GeminiOptimizer, apply_gemini

STEPS, ACCUM, BATCH = 4, 2, 4


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_gradient_phase_follows_backward_accumulation_and_step(precision):
    plain = build()
    groups = param_groups(plain)  # before apply_gemini: sharded parameters show no shape after
    model = apply_gemini(plain, GeminiConfig(precision=precision, chunk_numel=8192))
    opt = GeminiOptimizer(model, groups, lr=1e-2)
    rt, m = model.runtime, model.runtime.manager
    seen_kept = False
    for i, (x, y) in enumerate(batches(STEPS * ACCUM, BATCH)):
        opt.backward(model(x, y) / ACCUM)
        groups = [m.registry.group_of(c) for c in m.registry.trainable_chunks()]
        assert all(g.grads is GradPhase.REDUCED for g in groups)
        assert all(bool(g.kept_grads) is rt.keeping for g in groups)
        seen_kept |= rt.keeping
        # a later micro-batch's forward stashed the earlier one's gradients into "acc"
        assert all(g.accumulated is (i % ACCUM > 0) for g in groups)
        if (i + 1) % ACCUM == 0:
            opt.step()
            opt.zero_grad()
            assert not any(g.holds_gradients or g.kept_grads for g in m.groups.values())
    assert seen_kept is (precision == "fp32")  # one rank, no masters: kept once resident
