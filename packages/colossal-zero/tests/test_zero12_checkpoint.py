"""ZeRO-1/2 sharded checkpoints: resume at another data-parallel size, load into Gemini and back,
export to a plain state dict."""

from __future__ import annotations

from pathlib import Path

import _checks_zero as gemini_checks
import _checks_zero12 as checks
import pytest
from _zero_model import batches, build
from test_gemini import BATCH, assert_losses_close

from colossal_contracts import CheckpointError
from colossal_zero import (
    GeminiConfig,
    ZeroConfig,
    consolidate,
    load_sharded,
    load_zero_sharded,
    save_zero_sharded,
)

STEPS, SAVE_AT = 6, 3


def test_resume_at_other_sizes_into_gemini_and_export(world, tmp_path):
    cfg = ZeroConfig(stage=2, bucket_numel=3000)
    done = world(2).run(checks.save_and_continue, cfg, str(tmp_path), STEPS, BATCH, SAVE_AT)
    same = world(2).run(checks.load_and_continue, cfg, str(tmp_path), STEPS, BATCH, SAVE_AT)
    assert same[0] == done[0]  # same layout: exactly the same losses
    stage1 = ZeroConfig(stage=1, bucket_numel=5000)
    four = world(4).run(checks.load_and_continue, stage1, str(tmp_path), STEPS, BATCH, SAVE_AT)
    one = checks.load_and_continue(stage1, str(tmp_path), STEPS, BATCH, SAVE_AT)
    for resumed in (four[0], one):
        assert_losses_close(resumed, done[0], 1e-5)
    # Gemini reads the same files (its frozen parameters from rank 0's whole copy)
    model, opt = gemini_checks.make(GeminiConfig(precision="fp32"), seed=7)
    for n, p in model.module.named_parameters():
        if n.startswith("blocks.0.ln"):
            p.requires_grad_(False)
    load_sharded(model, opt, Path(tmp_path))
    x, y = batches(SAVE_AT + 1, BATCH)[SAVE_AT]
    assert abs(model(x, y).item() - done[0][0]) <= 1e-5 * done[0][0]
    plain = build(seed=99)
    plain.load_state_dict(consolidate(tmp_path), strict=True)
    assert abs(plain(x, y).item() - done[0][0]) <= 1e-5 * done[0][0]


def test_gemini_checkpoint_loads_into_zero(tmp_path):
    cfg = GeminiConfig(precision="fp32", chunk_numel=8192)
    done = gemini_checks.save_and_continue(cfg, str(tmp_path), STEPS, BATCH, SAVE_AT)
    model, opt = checks.make(ZeroConfig(stage=1), seed=5)
    load_zero_sharded(opt, tmp_path)
    resumed = checks.train(model, opt, STEPS - SAVE_AT, BATCH, start=SAVE_AT)
    assert_losses_close(resumed, done, 1e-5)


def test_checkpoint_of_another_model_is_named(tmp_path):
    _, opt = checks.make(ZeroConfig(stage=2))
    save_zero_sharded(opt, tmp_path)
    _, other = checks.make(ZeroConfig(stage=2), layers=4)
    with pytest.raises(CheckpointError, match="does not match the checkpoint"):
        load_zero_sharded(other, tmp_path)
