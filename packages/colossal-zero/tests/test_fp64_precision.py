"""Precision ``fp64`` ([Note: fp64 precision]): ZeRO-1/2 and Gemini keep parameters, gradients,
Adam's moments and the clipping norm in float64, so one process of each equals
``torch.optim.AdamW`` in float64 within 1e-12 (clipping on, two param groups, a budget that
moves Gemini's chunks), on the CPU and (``benchmarks/gpu_check.sh``) on CUDA; bf16 and fp32 keep
fp32 states; a device without float64 is refused.
The multi-rank layouts (ZeRO-2 x pp2 x tp2, Gemini x ring sp) are in colossal-stack's
``test_hybrid_plugin.py``."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from colossal_contracts import ConfigError
from colossal_zero import (
    GeminiConfig,
    GeminiOptimizer,
    LowLevelZeroOptimizer,
    Precision,
    ZeroConfig,
    apply_gemini,
)

STEPS, LR, CLIP, TOL = 4, 1e-2, 0.05, 1e-12
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
DEVICES = ["cpu", pytest.param("cuda", marks=CUDA)]


class _Net(nn.Module):
    """Embedding, two LayerNorm'd layers and a tied head: every kind of parameter, no cast."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(32, 24)
        self.ln = nn.LayerNorm(24)
        self.fc1, self.fc2 = nn.Linear(24, 64), nn.Linear(64, 24)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = self.emb(x)
        h = h + self.fc2(F.gelu(self.fc1(self.ln(h))))
        return F.cross_entropy(F.linear(h, self.emb.weight).flatten(0, 1), y.flatten())


def _groups(model: nn.Module) -> list[dict]:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    return [
        {"params": decay, "weight_decay": 0.1},
        {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0},
    ]


def _data(device: str = "cpu") -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [
        (
            torch.randint(0, 32, (4, 8), generator=g).to(device),
            torch.randint(0, 32, (4, 8), generator=g).to(device),
        )
        for _ in range(STEPS)
    ]


def _reference(model: nn.Module, device: str = "cpu") -> tuple[list[float], dict]:
    """Float64 ``torch.optim.AdamW`` on ``device`` (the same kernels as the run's)."""
    ref = copy.deepcopy(model).double().to(device)
    opt = torch.optim.AdamW(_groups(ref), lr=LR)
    losses = []
    for x, y in _data(device):
        loss = ref(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), CLIP)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, {k: v.cpu() for k, v in ref.state_dict().items()}


def _train(model: nn.Module, opt: torch.optim.Optimizer, device: str = "cpu") -> list[float]:
    losses = []
    for x, y in _data(device):
        loss = model(x, y)
        opt.backward(loss)  # type: ignore[attr-defined]
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def _worst(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> float:
    return max(float((got[k] - w).norm() / w.norm()) for k, w in want.items())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("stage", [1, 2])
def test_zero_fp64_equals_float64_adamw(stage, device):
    torch.manual_seed(0)
    model = _Net()
    ref_losses, ref = _reference(model, device)
    model = model.to(device)
    cfg = ZeroConfig(stage=stage, precision="fp64", bucket_numel=1000)  # several buckets
    opt = LowLevelZeroOptimizer(model, _groups(model), lr=LR, config=cfg, max_grad_norm=CLIP)
    losses = _train(model, opt, device)
    assert all(p.dtype is torch.float64 for p in model.parameters())
    assert all(b.exp_avg.dtype is torch.float64 and b.master is None for b in opt.buckets)
    got = opt.full_state_dict()
    assert all(v.dtype is torch.float64 for v in got.values())
    assert max(abs(a - b) / b for a, b in zip(losses, ref_losses, strict=True)) <= TOL
    assert _worst(got, ref) <= TOL
    assert opt.last_grad_norm > CLIP  # the clip was active: its factor is in the comparison


# On CUDA a chunk evicted to the host between the tied weight's two readers drops its gradient
# accumulator: the gradient arrives in two parts ([Note: gradients in parts], test_grad_parts.py).
@pytest.mark.parametrize("device", DEVICES)
def test_gemini_fp64_equals_float64_adamw_while_moving_chunks(device):
    torch.manual_seed(0)
    model = _Net()
    ref_losses, ref = _reference(model, device)
    groups = _groups(model)
    cfg = GeminiConfig(precision="fp64", device=device, chunk_numel=2048, accelerator_bytes=40_000)
    gm = apply_gemini(model, cfg)
    opt = GeminiOptimizer(gm, groups, lr=LR, max_grad_norm=CLIP)
    losses = _train(gm, opt, device)
    m = gm.runtime.manager
    assert {c.dtype for c in m.chunks.values()} == {torch.float64}  # params, grads, states
    assert gm.memory_stats().bytes_moved > 0  # the budget moved chunks
    got = gm.full_state_dict()
    assert max(abs(a - b) / b for a, b in zip(losses, ref_losses, strict=True)) <= TOL
    assert _worst(got, ref) <= TOL


def test_other_precisions_keep_fp32_states_and_fp64_is_refused_without_float64():
    for name in ("fp32", "bf16", "fp16"):
        assert Precision.parse(name).state_dtype is torch.float32
    fp64 = Precision.parse("fp64")
    assert fp64.param_dtype is torch.float64 and not fp64.master and not fp64.loss_scaling
    fp64.check_device("cpu")
    with pytest.raises(ConfigError, match="use precision='fp32'"):
        fp64.check_device("mps")
