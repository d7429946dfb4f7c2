"""[Note: kept gradients] and [Note: norm on demand]: resident fp32 steps on one rank keep
autograd's gradients instead of copying them into chunks, and the optimizer computes the gradient
norm only when someone reads it; both change no value."""

from __future__ import annotations

import pytest
import torch
from _zero_model import batches, build, param_groups

from colossal_contracts import ConfigError
from colossal_zero import GeminiConfig, GeminiOptimizer, apply_gemini

STEPS, BATCH = 5, 4
CONFIG = GeminiConfig(precision="fp32", chunk_numel=8192)


def _train(clip: float) -> tuple[list[float], list[float], dict[str, torch.Tensor], list[bool]]:
    """Losses, the gradient norm read after each step, final weights, and per step whether
    gradients were kept."""
    plain = build()
    groups = param_groups(plain)
    model = apply_gemini(plain, CONFIG)
    opt = GeminiOptimizer(model, groups, lr=1e-2, max_grad_norm=clip)
    losses, norms, kept = [], [], []
    for x, y in batches(STEPS, BATCH):
        loss = model(x, y)
        opt.backward(loss)
        kept.append(model.runtime.keeping)
        opt.step()
        norms.append(opt.last_grad_norm)
        opt.zero_grad()
        losses.append(loss.item())
    return losses, norms, model.full_state_dict(), kept


def _reference_norms() -> list[float]:
    """The gradient norm of each step of the same training in plain PyTorch."""
    model = build()
    opt = torch.optim.AdamW(param_groups(model), lr=1e-2)
    norms = []
    for x, y in batches(STEPS, BATCH):
        model(x, y).backward()
        norms.append(float(torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])))
        opt.step()
        opt.zero_grad()
    return norms


def test_norm_on_demand_and_kept_gradients_change_no_value():
    # a clipping threshold never reached: the norm is computed in step, the update is the same
    losses, norms, weights, kept = _train(clip=0.0)
    ref_losses, ref_norms, ref_weights, _ = _train(clip=1e9)
    assert all(kept[3:]), kept  # resident from the fourth step (see test_resident_steps)
    assert losses == ref_losses
    assert norms == ref_norms  # the same pieces, the same sums
    diff = [k for k in ref_weights if not torch.equal(weights[k], ref_weights[k])]
    assert not diff, f"weights differ: {diff[:4]}"
    assert norms == pytest.approx(_reference_norms(), rel=1e-5)


def test_a_norm_first_read_after_zero_grad_is_an_error():
    plain = build()
    model = apply_gemini(plain, CONFIG)
    opt = GeminiOptimizer(model, param_groups(plain), lr=1e-2)
    for i, (x, y) in enumerate(batches(2, BATCH)):
        opt.backward(model(x, y))
        opt.step()
        if i == 0:
            assert opt.last_grad_norm > 0
        opt.zero_grad()
    with pytest.raises(ConfigError, match="read it right after step"):
        opt.last_grad_norm  # noqa: B018
