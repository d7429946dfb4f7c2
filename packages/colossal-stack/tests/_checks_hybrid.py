"""Rank-side checks of ``HybridParallelPlugin`` (run inside a colossal_testing World).

Each case trains GPT (no biases: see [Note: pipeline vs tp] in colossal-models' pipeline checks)
through the Booster next to the unsharded single-process model with ``torch.optim.AdamW`` and
the same clipping, on the same global batches, and reports the worst error of the losses and of
the weights after the last step. The reference weights are sharded the way the plugin sharded
the model (``parallelize`` of a copy on the same mesh), so each rank compares what it holds.
Weight error is per parameter ``|w - ref| / |ref|`` (Frobenius norms), the worst parameter.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist

from colossal import Booster, HybridParallelPlugin
from colossal_contracts import ConfigError
from colossal_models import GPT, GPTConfig, parallelize

B, T, LR, CLIP = 8, 16, 1e-3, 0.05


def _model(layers: int) -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig(
        vocab_size=128, max_seq_len=T, num_layers=layers, num_heads=4, hidden_size=32, bias=False
    )
    return GPT(cfg)


def _batches(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(3)
    out = []
    for _ in range(steps):
        d = torch.randint(0, 128, (B, T + 1), generator=g)
        out.append((d[:, :-1], d[:, 1:]))
    return out


def _reference(layers: int, steps: int, m: int) -> tuple[list[float], GPT]:
    """Single-process AdamW on the global batch (gradients of ``m`` equal micro-batches summed,
    as the pipeline sums them), clipped at ``CLIP``."""
    ref = _model(layers)
    opt = torch.optim.AdamW(ref.parameters(), lr=LR)
    losses = []
    for x, y in _batches(steps):
        total = 0.0
        for xm, ym in zip(x.chunk(m), y.chunk(m)):
            loss = ref(xm, ym) / m
            loss.backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), CLIP)
        opt.step()
        opt.zero_grad()
        losses.append(total)
    return losses, ref


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


def train_case(settings: dict, steps: int, layers: int = 4) -> dict:
    """``steps`` Booster steps of the plugin ``settings`` against the reference."""
    plugin = HybridParallelPlugin(max_grad_norm=CLIP, **settings)
    model = _model(layers)
    booster = Booster(plugin)
    model, opt = booster.boost(model, torch.optim.AdamW(model.parameters(), lr=LR))
    mesh = plugin.mesh
    assert mesh is not None
    coord, dp = plugin.data_rank()
    rows = slice(coord * B // dp, (coord + 1) * B // dp)
    losses = []
    for x, y in _batches(steps):
        if plugin.pp_size > 1:
            loss = booster.execute_pipeline(x[rows], y[rows], model, opt)
        else:
            loss = model(x[rows], y[rows])
            booster.backward(loss, opt)
        opt.step()
        opt.zero_grad()
        t = loss.detach().float().reshape(1)
        dist.all_reduce(t, group=mesh.group("dp"))
        losses.append(float(t) / dp)
    ref_losses, ref = _reference(layers, steps, plugin.microbatches)
    want_model = copy.deepcopy(ref)
    if plugin.tp_size > 1:
        parallelize(want_model, mesh, sequence_parallel=plugin.sequence_parallel == "megatron")
    want = dict(want_model.named_parameters())
    errs = {}
    for n, p in model.named_parameters():
        key = n.split(".", 2)[2] if n.startswith("chunks.") else n
        errs[n] = _rel(p.detach().float(), want[key].detach())
    worst = max(errs, key=errs.__getitem__)
    loss_err = max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses, strict=True))
    stats = booster.memory_stats()
    plugin.close()
    return {
        "loss_err": loss_err,
        "weight_err": errs[worst],
        "worst": worst,
        "num_params": len(errs),
        "stats": stats,
        "losses": losses,
    }


def bad_settings() -> dict[str, str]:
    """Each bad setting raises a one-line ConfigError before any process group exists."""
    out: dict[str, str] = {}
    world = dist.get_world_size()
    cases = {
        "not dividing": {"tp_size": 3},
        "non-square 2d": {"tp_size": 2, "tp_mode": "2d"},
        "zero 3": {"zero_stage": 3},
        "stages > layers": {"pp_size": world},
    }
    for name, kw in cases.items():
        try:
            plugin = HybridParallelPlugin(**kw)
            model = _model(2)
            Booster(plugin).boost(model, torch.optim.AdamW(model.parameters()))
            out[name] = "no error"
            plugin.close()
        except ConfigError as e:
            out[name] = str(e)
    return out
