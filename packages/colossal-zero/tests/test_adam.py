"""The fused hybrid Adam/AdamW against torch's optimizers."""

from __future__ import annotations

import math

import pytest
import torch

from colossal_contracts import ConfigError
from colossal_zero import AdamHyper, HybridAdam, adamw_update, global_grad_norm


def _params(seed: int = 0) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=g)) for s in ((7, 5), (11,), (3, 4, 2))]


def _run(opt: torch.optim.Optimizer, params: list[torch.nn.Parameter], steps: int = 5) -> None:
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=g)
        opt.step()


@pytest.mark.parametrize("adamw", [True, False])
def test_matches_torch_with_param_groups_and_weight_decay(adamw):
    ours, ref = _params(), _params()

    def groups(ps: list) -> list[dict]:
        return [
            {"params": ps[:1], "weight_decay": 0.1},
            {"params": ps[1:], "weight_decay": 0.0, "lr": 3e-2},
        ]

    torch_cls = torch.optim.AdamW if adamw else torch.optim.Adam
    _run(HybridAdam(groups(ours), lr=1e-2, adamw=adamw), ours)
    _run(torch_cls(groups(ref), lr=1e-2), ref)
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_grad_scale_divides_gradients_first():
    p1, p2 = torch.ones(10), torch.ones(10)
    g = torch.linspace(-1, 1, 10)
    states = [[torch.zeros(10), torch.zeros(10), torch.ones(())] for _ in range(2)]
    hyper = AdamHyper(lr=0.1, weight_decay=0.01)
    adamw_update([p1], [g.clone()], [states[0][0]], [states[0][1]], [states[0][2]], hyper)
    adamw_update(
        [p2], [g * 8], [states[1][0]], [states[1][1]], [states[1][2]], hyper, grad_scale=8.0
    )
    torch.testing.assert_close(p1, p2)


def test_global_grad_norm_and_overflow():
    gs = [torch.full((4,), 3.0), torch.full((9,), 1.0)]
    assert global_grad_norm(gs) == pytest.approx(math.sqrt(4 * 9 + 9))
    assert math.isinf(global_grad_norm([torch.tensor([1.0, float("inf")])]))
    assert math.isnan(global_grad_norm([torch.tensor([float("nan")])]))
    assert global_grad_norm([]) == 0.0


def test_rejects_low_precision_and_bad_hyperparameters():
    p = torch.nn.Parameter(torch.ones(3, dtype=torch.bfloat16))
    p.grad = torch.ones(3, dtype=torch.bfloat16)
    with pytest.raises(ConfigError, match="fp32"):
        HybridAdam([p]).step()
    with pytest.raises(ConfigError, match="betas"):
        HybridAdam([torch.nn.Parameter(torch.ones(1))], betas=(0.9, 1.5))
