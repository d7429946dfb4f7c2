"""``precision="fp64"`` through the plugins in one process ([Note: fp64 precision] in
colossal-zero): the hybrid plugin with ZeRO-0/1/2 and Gemini cast a GPT built in fp32 to float64
and keep every state in float64, so each equals float64 AdamW within 1e-12 (the multi-rank
layouts are in ``test_hybrid_plugin.py``); an unknown precision is still refused."""

from __future__ import annotations

import pytest
import torch
from _checks_hybrid import CLIP, LR, _model, _reference, _rel, batches, train_case

from colossal import Booster, GeminiPlugin, HybridParallelPlugin, LowLevelZeroPlugin
from colossal.booster import GeminiConfig
from colossal_contracts import ConfigError

TOL = 1e-12


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_hybrid_fp64_casts_an_fp32_model_and_equals_float64_adamw(stage):
    # the model is built in fp32; the float64 reference is the same model cast exactly
    out = train_case({"zero_stage": stage, "precision": "fp64"}, 3, 2, "float32", "float64")
    assert out["dtypes"] == ["torch.float64"]
    assert out["loss_err"] <= TOL and out["weight_err"] <= TOL, out


def test_gemini_fp64_casts_an_fp32_model_and_equals_float64_adamw():
    config = GeminiConfig(placement="static", precision="fp64", accelerator_bytes=320 << 10)
    plugin = GeminiPlugin(config=config, max_grad_norm=CLIP)
    model = _model(2)  # fp32
    booster = Booster(plugin)
    model, opt = booster.boost(model, torch.optim.AdamW(model.parameters(), lr=LR))
    losses = []
    for x, y in batches(3):
        loss = model(x, y)
        booster.backward(loss, opt)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    ref_losses, ref = _reference(2, 3, 1, "float64")
    full = model.full_state_dict()
    assert {v.dtype for v in full.values()} == {torch.float64}
    assert booster.memory_stats()["bytes_moved_total"] > 0  # the budget moved chunks
    assert max(abs(a - b) / b for a, b in zip(losses, ref_losses, strict=True)) <= TOL
    assert max(_rel(full[n], p.detach()) for n, p in ref.named_parameters()) <= TOL


def test_fp64_is_a_precision_of_each_sharding_plugin():
    for plugin in (
        HybridParallelPlugin(precision="fp64"),
        LowLevelZeroPlugin(stage=2, precision="fp64"),
        GeminiPlugin(config=GeminiConfig(precision="fp64")),
    ):
        assert plugin.combination().precision == "fp32"  # composes as fp32 does
    with pytest.raises(ConfigError, match=r"unknown precision 'fp8'; choose one of: .*fp64"):
        HybridParallelPlugin(precision="fp8")
