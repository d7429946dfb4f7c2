"""Rank-side checks of layout-independent checkpoints (run inside a colossal_testing World).

A run trains GPT (hidden 32, fp32) through ``HybridParallelPlugin`` on one layout, saves with
``Booster.save``; another run boosts a model built from *another* seed on another layout, loads
with ``Booster.load`` and goes on. Its losses are compared (by the test) with one uninterrupted
single-process AdamW run on the same global batches with the same clipping (those of
``_checks_hybrid``).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from _checks_hybrid import CLIP, LR, B, T, batches

from colossal import Booster, HybridParallelPlugin
from colossal_models import GPT, GPTConfig


def make_model(*, bias: bool, seed: int = 0, layers: int = 4) -> GPT:
    torch.manual_seed(seed)
    cfg = GPTConfig(
        vocab_size=128, max_seq_len=T, num_layers=layers, num_heads=4, hidden_size=32, bias=bias
    )
    return GPT(cfg)


def hybrid_steps(
    settings: dict,
    root: str,
    *,
    first: int,
    last: int,
    bias: bool,
    load: bool,
    save_root: str | None = None,
) -> list[float]:
    """Steps ``first..last-1`` on the layout ``settings``: boost a model of seed 0 (or, with
    ``load``, of seed 7 and load ``root/step-<first>``); save ``step-<last>`` under
    ``save_root`` (default ``root``)."""
    plugin = HybridParallelPlugin(max_grad_norm=CLIP, **settings)
    model = make_model(bias=bias, seed=7 if load else 0)
    booster = Booster(plugin)
    model, opt = booster.boost(model, torch.optim.AdamW(model.parameters(), lr=LR))
    if load:
        info = booster.load(model, opt, Path(root) / f"step-{first}")
        assert info["step"] == first, info
    mesh = plugin.mesh
    assert mesh is not None
    coord, dp = plugin.data_rank()
    rows = slice(coord * B // dp, (coord + 1) * B // dp)
    losses = []
    for x, y in batches(last)[first:]:
        loss = booster.execute_pipeline(x[rows], y[rows], model, opt)
        opt.step()
        opt.zero_grad()
        t = loss.detach().float().reshape(1)
        dist.all_reduce(t, group=mesh.group("dp"))
        losses.append(float(t) / dp)
    booster.save(model, opt, Path(save_root or root), step=last)
    plugin.close()
    return losses
