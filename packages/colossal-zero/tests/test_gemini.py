"""Gemini against plain PyTorch AdamW on one process: same losses and weights (fp32), near fp32's
(bf16: losses within autocast's, weights by [Note: bf16 tolerance] in ``_zero_model``), under
budgets that force chunk moves every step."""

from __future__ import annotations

import _checks_zero as checks
import pytest
import torch
from _zero_model import assert_like_fp32, param_groups, reference

from colossal_contracts import ConfigError
from colossal_zero import GeminiConfig, GeminiOptimizer, apply_gemini

STEPS, BATCH = 10, 8
TIGHT = GeminiConfig(precision="fp32", accelerator_bytes=160_000, chunk_numel=8192)


def rel_err(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).norm() / b[k].float().norm()) for k in b)


def assert_losses_close(got: list[float], want: list[float], rel: float) -> None:
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert abs(g - w) <= rel * abs(w), f"step {i}: {g} vs {w}"


@pytest.mark.parametrize("placement", ["auto", "static"])
def test_fp32_matches_adamw_with_evictions_every_step(placement):
    cfg = GeminiConfig(
        precision="fp32", placement=placement, accelerator_bytes=160_000, chunk_numel=8192
    )
    losses, weights, moved = checks.run_gemini(cfg, STEPS, BATCH)
    ref_losses, ref_weights = reference(STEPS, BATCH)
    assert_losses_close(losses, ref_losses, 1e-5)
    assert rel_err(weights, ref_weights) <= 1e-5
    assert all(m > 0 for m in moved), moved  # the budget forced chunk moves in every step


def test_bf16_within_autocast_tolerance():
    cfg = GeminiConfig(precision="bf16", accelerator_bytes=60_000, chunk_numel=8192)
    losses, weights, moved = checks.run_gemini(cfg, STEPS, BATCH)
    ref_losses, _ = reference(STEPS, BATCH, autocast=True)
    assert_losses_close(losses, ref_losses, 3e-2)
    assert_like_fp32(weights, STEPS, BATCH)
    assert losses[-1] < losses[0]
    assert all(m > 0 for m in moved), moved


def test_gradient_accumulation_and_clipping_match():
    losses, weights, _ = checks.run_gemini(TIGHT, 8, BATCH, accum=3, clip=0.5)
    ref_losses, ref_weights = reference(8, BATCH, accum=3, clip=0.5)
    assert_losses_close(losses, ref_losses, 1e-5)
    assert rel_err(weights, ref_weights) <= 1e-5


def test_bf16_gradient_accumulation_reuses_storage_and_restores_params():
    cfg = GeminiConfig(precision="bf16", chunk_numel=8192)
    losses, weights, _ = checks.run_gemini(cfg, 6, BATCH, accum=2)
    ref_losses, _ = reference(6, BATCH, accum=2, autocast=True)
    assert_losses_close(losses, ref_losses, 3e-2)
    assert_like_fp32(weights, 6, BATCH, accum=2)


def test_unused_parameter_is_left_alone_like_torch():
    # the first backward cannot know the parameter is unused: its chunk waits until the end
    cfg = GeminiConfig(precision="fp32", accelerator_bytes=200_000, chunk_numel=8192)
    losses, weights, _ = checks.run_gemini(cfg, 5, BATCH, unused=True)
    ref_losses, ref_weights = reference(5, BATCH, unused=True)
    assert_losses_close(losses, ref_losses, 1e-5)
    assert rel_err(weights, ref_weights) <= 1e-5
    assert torch.equal(weights["spare.weight"], ref_weights["spare.weight"])


def test_frozen_parameters_match_torch_and_are_released_after_their_backward():
    freeze = ("wpe", "blocks.0.fc")
    plain = checks.build()
    for n, p in plain.named_parameters():
        if n.startswith(freeze):
            p.requires_grad_(False)
    groups = param_groups(plain)
    model = apply_gemini(plain, TIGHT)
    opt = GeminiOptimizer(model, groups, lr=1e-2)
    rt, released = model.runtime, []
    real = rt.post_backward
    rt.post_backward = lambda names: released.append(names) or real(names)
    losses = checks.train(model, opt, 5, BATCH)
    ref_losses, ref_weights = reference(5, BATCH, freeze=freeze)
    assert_losses_close(losses, ref_losses, 1e-5)
    assert rel_err(model.full_state_dict(), ref_weights) <= 1e-5
    assert any("blocks.0.fc.weight" in names for names in released)  # before backward ended


def test_fp16_loss_scaling_skips_overflow_and_backs_off():
    model, opt = checks.make(GeminiConfig(precision="fp16", chunk_numel=8192))
    x, y = checks.batches(1, BATCH)[0]
    before = model.full_state_dict()
    scale = opt.loss_scale
    loss = model(x, y)
    opt.backward(loss * float("inf"))
    opt.step()
    opt.zero_grad()
    assert opt.skipped_last and opt.loss_scale == scale / 2
    after = model.full_state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    losses = checks.train(model, opt, 10, BATCH)
    assert not opt.skipped_last and losses[-1] < losses[0]


def test_budget_smaller_than_a_chunk_is_a_clear_error_before_training():
    with pytest.raises(ConfigError, match="cannot hold one chunk"):
        apply_gemini(checks.build(), GeminiConfig(accelerator_bytes=10_000, chunk_numel=8192))


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [("placement", "dynamic", "unknown placement"), ("precision", "fp8", "unknown precision")],
)
def test_unknown_placement_or_precision_is_a_config_error(field, value, match):
    with pytest.raises(ConfigError, match=match):
        GeminiConfig(**{field: value})


@pytest.mark.parametrize("value", [0, -1, True, 2.0, "3"])
def test_gather_ahead_must_be_a_positive_int(value):
    with pytest.raises(ConfigError, match="gather_ahead must be an int >= 1"):
        GeminiConfig(gather_ahead=value)


def test_a_group_that_is_neither_a_process_group_nor_default_is_a_config_error():
    with pytest.raises(ConfigError, match='"default"'):
        apply_gemini(torch.nn.Linear(4, 4), GeminiConfig(), group="world")


def test_stats_report_tiers_and_moves():
    model, opt = checks.make(TIGHT)
    checks.train(model, opt, 2, BATCH)
    stats = model.memory_stats()
    acc = stats.tiers["accelerator"]
    assert acc.emulated and 0 < acc.peak_bytes <= 160_000
    assert stats.moved("host", "accelerator").num_bytes > 0


def test_prefetch_after_warmup_keeps_results_exact():
    cfg = GeminiConfig(precision="fp32", accelerator_bytes=200_000, chunk_numel=8192, prefetch=2)
    model, opt = checks.make(cfg)
    manager, issued = model.runtime.manager, []
    real_prefetch = manager.residency.prefetch
    manager.residency.prefetch = lambda horizon=1: (
        issued.append(real_prefetch(horizon)) or issued[-1]
    )
    losses = checks.train(model, opt, 6, BATCH)
    ref_losses, ref_weights = reference(6, BATCH)
    assert_losses_close(losses, ref_losses, 1e-5)
    assert rel_err(model.full_state_dict(), ref_weights) <= 1e-5
    assert sum(issued) > 0  # copies were issued ahead of use once the order was traced
