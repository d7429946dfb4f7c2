"""Rank-side halves of test_layouts_build.py: build and train layouts of ``colossal plan``."""

from __future__ import annotations

import math
import os
from typing import Any

import torch

from colossal import Booster, TrainConfig, build_plugin, train
from colossal.plan import PlanRequest, evaluate
from colossal.plan._layout import parse_layout
from colossal.train._layout import apply_layout, layout_flags, local_hardware, train_shape
from colossal.train._models import resolve_model
from colossal_models import ByteTokenizer


def one_step_each(layouts: list[str], base: dict[str, Any]) -> dict[str, float]:
    """Build each layout (``describe()`` text) through the job's flags and plugin, train one
    step on a fixed batch; the loss of each (the dp mean is not taken: any finite loss)."""
    world = torch.distributed.get_world_size()
    out = {}
    shape = train_shape(base["model"], base["preset"], ByteTokenizer.vocab_size)
    hw = local_hardware(world, base, None)
    for text in layouts:
        lay = parse_layout(text)
        req = PlanRequest(shape, hw, world, 4, base["seq_len"], precision="fp32")
        cfg = TrainConfig(**{**base, **layout_flags(lay, evaluate(req, lay))})
        spec = resolve_model(cfg.model, cfg.preset, vocab_size=ByteTokenizer.vocab_size)
        plugin = build_plugin(cfg.plugin, cfg)
        torch.manual_seed(0)
        model = spec.build()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        booster = Booster(plugin)
        model, opt = booster.boost(model, opt)
        g = torch.Generator().manual_seed(1)
        x = torch.randint(0, ByteTokenizer.vocab_size, (cfg.batch_size, cfg.seq_len), generator=g)
        loss = booster.execute_pipeline(x, x, model, opt)  # forward + backward, any layout
        opt.step()
        out[text] = float(loss)
        if hasattr(plugin, "close"):
            plugin.close()
        assert math.isfinite(out[text]), text
    return out


def train_auto(kw: dict[str, Any]) -> dict[str, Any]:
    """``colossal train --layout auto`` on this world (as the CLI does it)."""
    os.environ["WORLD_SIZE"] = str(torch.distributed.get_world_size())
    os.environ["RANK"] = str(torch.distributed.get_rank())
    result = train(TrainConfig(**apply_layout("auto", kw)))
    return {"losses": result.losses}
