"""Gemini's Adam update in backward ([Note: update in backward]): with a disk tier under budgets
that put most fp32 values and Adam states on disk, training with each chunk updated as soon as
its gradients are reduced equals the unfused step bit for bit (losses and weights; fp32 and
bf16, 1 and 2 ranks, 2 micro-batches, an lr schedule), writes and reads fewer disk bytes per
step, equals plain AdamW, and refuses to be forced on where it cannot run."""

from __future__ import annotations

import _checks_update as cu
import pytest
import torch
from _zero_model import build, param_groups, reference
from test_gemini import assert_losses_close, rel_err

from colossal_contracts import ConfigError
from colossal_zero import GeminiConfig, GeminiOptimizer, apply_gemini

STEPS, BATCH = 6, 8
CASES = {  # name -> (precision, ranks, micro-batches per step, lr schedule)
    "fp32, 1 rank, lr schedule": ("fp32", 1, 1, True),
    "bf16, 1 rank, 2 micro-batches": ("bf16", 1, 2, False),
    "fp32, 2 ranks, 2 micro-batches, lr schedule": ("fp32", 2, 2, True),
    "bf16, 2 ranks, lr schedule": ("bf16", 2, 1, True),
}


def _runs(world, tmp_path, name: str, update: bool | None) -> list[tuple]:  # type: ignore[no-untyped-def]
    precision, ranks, accum, schedule = CASES[name]
    args = (str(tmp_path / f"update-{update}"), precision, update, STEPS, BATCH)
    if ranks == 1:
        return [cu.run(*args, accum=accum, schedule=schedule)]
    return world(ranks).run(cu.run, *args, accum=accum, schedule=schedule)


@pytest.mark.parametrize("name", CASES)
def test_the_update_in_backward_equals_the_unfused_step_bit_for_bit(world, tmp_path, name):
    fused = _runs(world, tmp_path, name, None)  # automatic: on with a disk tier
    unfused = _runs(world, tmp_path, name, False)
    for f, u in zip(fused, unfused, strict=True):  # every rank
        assert f[0] == u[0]  # the losses
        assert f[5] == u[5]  # the gradient norms: the same squares, summed in the same order
        assert f[1].keys() == u[1].keys()
        assert all(torch.equal(f[1][k], u[1][k]) for k in u[1])  # the weights
        assert sum(u[2]) == 0  # unfused: every chunk still held its gradients after backward
        # automatic mode starts once the states are placed (two steps measure the demand)
        assert all(n > 0 for n in f[2][-2:]), f[2]


def test_gradients_on_disk_are_neither_written_nor_read_back(tmp_path):
    # fp32 on one rank: the reduced gradients are a chunk of their own ("grad"), consumed by the
    # update as soon as they are reduced, and their values dead after it (colossal-chunk's
    # [Note: dead shards]): later evictions write nothing, nothing reads them back
    fused = cu.run(str(tmp_path / "fused"), "fp32", None, STEPS, BATCH)
    unfused = cu.run(str(tmp_path / "unfused"), "fp32", False, STEPS, BATCH)
    on = [i for i, n in enumerate(fused[2]) if n > 0]
    assert on, fused[2]
    for i in on:  # every step updated in backward writes and reads fewer disk bytes
        assert fused[3][i] < unfused[3][i], (i, fused[3], unfused[3])
        assert fused[4][i] < unfused[4][i], (i, fused[4], unfused[4])


def test_it_equals_plain_adamw(tmp_path):
    losses, weights, updated, *_ = cu.run(str(tmp_path), "fp32", True, STEPS, BATCH, accum=2)
    ref_losses, ref_weights = reference(STEPS, BATCH, accum=2)
    assert sum(updated) > 0
    assert_losses_close(losses, ref_losses, 1e-5)
    assert rel_err(weights, ref_weights) <= 1e-5


@pytest.mark.parametrize(
    ("precision", "clip", "why"),
    [("fp32", 1.0, "max_grad_norm=1.0 clips"), ("fp16", 0.0, "loss scaler checks")],
)
def test_forced_on_where_it_cannot_run_is_a_config_error(tmp_path, precision, clip, why):
    config = cu.disk_config(tmp_path, precision, True)
    model = apply_gemini(build(), config)
    with pytest.raises(ConfigError, match=why) as err:
        GeminiOptimizer(model, param_groups(model.module), max_grad_norm=clip)
    assert "update_in_backward" in str(err.value) and "None" in str(err.value)  # the fixes
    model.runtime.manager.close()
    # automatic mode steps after the backward there instead
    auto = apply_gemini(build(), cu.disk_config(tmp_path / "auto", precision, None))
    GeminiOptimizer(auto, param_groups(auto.module), max_grad_norm=clip)
    auto.runtime.manager.close()


def test_undeclared_accumulation_keeps_the_unfused_step(tmp_path):
    # automatic mode: a step with two backwards outside accumulating() turns it off for good
    auto = cu.run(str(tmp_path / "auto"), "fp32", None, STEPS, BATCH, accum=2, declare=False)
    off = cu.run(str(tmp_path / "off"), "fp32", False, STEPS, BATCH, accum=2)
    assert sum(auto[2]) == 0
    assert auto[0] == off[0] and all(torch.equal(auto[1][k], off[1][k]) for k in off[1])


def test_a_backward_after_one_that_updated_is_refused(tmp_path):
    model = apply_gemini(build(), cu.disk_config(tmp_path, "fp32", True))
    opt = GeminiOptimizer(model, param_groups(model.module))
    data = cu.batches(5, BATCH)
    for x, y in data[:4]:  # the warmup and the steps that place the states
        opt.backward(model(x, y))
        opt.step()
        opt.zero_grad()
    x, y = data[4]
    opt.backward(model(x, y))  # updates chunks
    with pytest.raises(ConfigError, match="accumulating"):
        opt.backward(model(x, y))
    model.runtime.manager.close()


def test_the_setting_is_checked():
    with pytest.raises(ConfigError, match="update_in_backward"):
        GeminiConfig(update_in_backward="yes")  # type: ignore[arg-type]
