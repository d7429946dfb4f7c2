"""ZeRO stages 1 and 2 against plain single-process AdamW: 1, 2 and 4 data-parallel ranks,
accumulation, clipping, frozen and unused parameters; bf16/fp16; optimizer offload; bad input."""

from __future__ import annotations

import _checks_zero12 as checks
import pytest
import torch
from _zero_model import assert_like_fp32, batches, build, param_groups, reference
from test_gemini import BATCH, STEPS, assert_losses_close, rel_err

from colossal_contracts import CapacityError, ConfigError
from colossal_zero import LossScalerConfig, LowLevelZeroOptimizer, ZeroConfig

# Small buckets: several per model, so stage 2 overlaps reduce-scatters with backward.
SETUP = dict(accum=2, clip=0.5, freeze=("blocks.0.",), unused=True)


# 4 ranks under stage 2 only: stage 1 shards the same buckets, keeping whole gradients
@pytest.mark.parametrize(("stage", "n"), [(1, 1), (1, 2), (2, 1), (2, 2), (2, 4)])
def test_fp32_matches_single_process_adamw(world, stage, n):
    cfg = ZeroConfig(stage=stage, bucket_numel=3000)
    if n == 1:
        out = [checks.run_zero(cfg, STEPS, BATCH, **SETUP)]
    else:
        out = world(n).run(checks.run_zero, cfg, STEPS, BATCH, **SETUP)
    ref_losses, ref_weights = reference(STEPS, BATCH, **SETUP)
    for losses, weights, _ in out:
        assert_losses_close(losses, ref_losses, 1e-5)
        assert rel_err(weights, ref_weights) <= 1e-5
        assert rel_err(weights, out[0][1]) == 0.0  # replicas identical
    states = out[0][2]
    trainable = sum(p.numel() for p in build(unused=True).parameters()) - sum(
        p.numel() for p in build().blocks[0].parameters()
    )
    assert states["optimizer_states"] <= 8 * (trainable / n + 3000)  # sharded moments
    grads_whole = 4 * trainable
    assert (
        (states["grads"] >= grads_whole)
        if stage == 1
        else (states["grads"] < grads_whole or n == 1)
    )


@pytest.mark.parametrize(("stage", "precision"), [(1, "bf16"), (2, "fp16")])
def test_low_precision_within_autocast_tolerance(world, stage, precision):
    # one micro-batch per step: gradients accumulate in the compute precision, which the
    # autocast reference (fp32 gradients) does not; the fp32 tests cover accumulation
    accum = 1
    # a first scale that does not overflow on step 1 (a skipped step would not match autocast)
    scaler = LossScalerConfig(init_scale=2.0**8)
    cfg = ZeroConfig(stage=stage, precision=precision, bucket_numel=3000, loss_scaler=scaler)
    losses, weights, states = world(2).run(checks.run_zero, cfg, 10, BATCH, accum=accum)[0]
    ref_losses, _ = reference(10, BATCH, accum=accum, autocast=True)
    assert_losses_close(losses, ref_losses, 3e-2)
    assert_like_fp32(weights, 10, BATCH, accum=accum)
    assert states["masters"] > 0


def test_offloaded_optimizer_matches_adamw(world):
    cfg = ZeroConfig(stage=2, offload_optimizer=True, host_bytes=1 << 30, bucket_numel=3000)
    losses, weights, _ = world(2).run(checks.run_zero, cfg, 6, BATCH, clip=0.5)[0]
    ref_losses, ref_weights = reference(6, BATCH, clip=0.5)
    assert_losses_close(losses, ref_losses, 1e-5)
    assert rel_err(weights, ref_weights) <= 1e-5


def test_fp16_overflow_skips_the_step_and_backs_off():
    model = build()
    opt = LowLevelZeroOptimizer(model, param_groups(model), config=ZeroConfig(precision="fp16"))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x, y = batches(1, 4)[0]
    opt.backward(model(x, y) * float("inf"))
    opt.step()
    assert opt.skipped_last and opt.loss_scale == 2.0**15
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(stage=3), "use GeminiPlugin"),
        (dict(stage=0), "unknown ZeRO stage 0"),
        (dict(precision="fp8"), "unknown precision"),
        (dict(bucket_numel=0), "bucket_numel"),
    ],
)
def test_bad_config_is_one_line_config_error(kwargs, match):
    with pytest.raises(ConfigError, match=match) as err:
        ZeroConfig(**kwargs)
    assert "\n" not in str(err.value)


def test_offload_without_host_room_is_a_capacity_error():
    model = build()
    cfg = ZeroConfig(offload_optimizer=True, host_bytes=1000)
    with pytest.raises(CapacityError, match="offloading the optimizer needs") as err:
        LowLevelZeroOptimizer(model, model.parameters(), config=cfg)
    assert "\n" not in str(err.value)


def test_low_precision_model_is_refused():
    model = build().to(torch.bfloat16)
    with pytest.raises(ConfigError, match="build the model in fp32"):
        LowLevelZeroOptimizer(model, model.parameters())
