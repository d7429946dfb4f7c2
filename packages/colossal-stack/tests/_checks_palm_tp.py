"""Rank side of test_palm_tp: PaLM through the Booster with tp2 (its key/value projection is
wrapped on sharding, ``GatheredKV``) against single-process AdamW, in float64."""

from __future__ import annotations

import copy

import torch

from colossal import Booster, GeminiPlugin, HybridParallelPlugin
from colossal.booster import GeminiConfig
from colossal_models import PaLM, PaLMConfig

STEPS, LR, T = 3, 1e-2, 16


def _batches(vocab: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return [torch.randint(0, vocab, (4, T), generator=g) for _ in range(STEPS)]


def _groups(model: torch.nn.Module) -> list[dict]:
    """Weight decay on matrices only: each sharded parameter must keep its group."""
    ps = list(model.parameters())
    return [
        {"params": [p for p in ps if p.dim() >= 2], "weight_decay": 0.1},
        {"params": [p for p in ps if p.dim() < 2], "weight_decay": 0.0},
    ]


def palm_tp2_case(plugin: str, num_kv_heads: int) -> float:
    """Largest relative loss difference over ``STEPS`` steps against AdamW on one process."""
    torch.manual_seed(0)
    cfg = PaLMConfig.preset("nano", num_heads=4, num_kv_heads=num_kv_heads)
    model = PaLM(cfg).double()
    ref = copy.deepcopy(model)
    ref_opt = torch.optim.AdamW(_groups(ref), lr=LR)
    want = []
    for x in _batches(cfg.vocab_size):
        loss = ref(x, x)
        loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        want.append(loss.item())
    opt = torch.optim.AdamW(_groups(model), lr=LR)
    if plugin == "hybrid":
        chosen = HybridParallelPlugin(tp_size=2, precision="fp64")
    else:
        chosen = GeminiPlugin(tp_size=2, config=GeminiConfig(precision="fp64"))
    booster = Booster(chosen)
    model, opt = booster.boost(model, opt)
    got = []
    for x in _batches(cfg.vocab_size):
        loss = model(x, x)
        booster.backward(loss, opt)
        opt.step()
        opt.zero_grad()
        got.append(loss.item())
    chosen.close()
    return max(abs(a - b) / b for a, b in zip(got, want, strict=True))
