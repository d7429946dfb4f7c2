"""Rank-side half of test_grid_checkpoint.py (run inside a colossal_testing World): Gemini with a
grid tensor-parallel layout (2D, 2.5D, 3D) trains GPT, saves its layout-independent checkpoint
through ``Booster.save`` and reports the unsharded fp32 masters it saved; or another layout loads
such a checkpoint into a model built from another seed and trains on. The model, batches and
clipping are ``_checks_hybrid``'s (one global batch per step, split over dp).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from _checks_hybrid import CLIP, LR, B, batches
from _checks_hybrid_checkpoint import make_model

from colossal import Booster, GeminiPlugin
from colossal_models.sharding import gather_full_state_dict

LAYERS = 2  # every rank of a grid runs every block: two keep the 8-rank runs short


def gemini_run(
    settings: dict,
    *,
    bias: bool,
    first: int,
    last: int,
    load: str | None = None,
    save: str | None = None,
    save_step: int | None = None,
) -> dict[str, Any]:
    """Steps ``first..last-1`` of ``GeminiPlugin(**settings)`` on GPT (``bias``: with biases;
    without, a grid LayerNorm holds a frozen zero bias the unsharded model lacks). With
    ``load``: a model of seed 7 loads ``load/step-<first>`` first. With ``save``: after step
    ``save_step`` (default ``last``) it saves ``save/step-<save_step>``. Returns the global mean
    loss of each step, the mesh, and on rank 0 the unsharded state at the save (``full``)."""
    plugin = GeminiPlugin(max_grad_norm=CLIP, export_full_model=False, **settings)
    model = make_model(bias=bias, seed=7 if load else 0, layers=LAYERS)
    booster = Booster(plugin)
    model, opt = booster.boost(model, torch.optim.AdamW(model.parameters(), lr=LR))
    mesh = plugin.mesh
    assert mesh is not None
    if load is not None:
        info = booster.load(model, opt, Path(load) / f"step-{first}")
        assert info["step"] == first, info
    coord, dp = mesh.coord("dp"), mesh.size("dp")
    rows = slice(coord * B // dp, (coord + 1) * B // dp)
    out: dict[str, Any] = {"losses": [], "full": None}
    at = save_step if save_step is not None else last
    for step, (x, y) in enumerate(batches(last)[first:], start=first):
        loss = model(x[rows], y[rows])
        booster.backward(loss, opt)
        opt.step()
        opt.zero_grad()
        t = loss.detach().double().reshape(1)
        dist.all_reduce(t, group=mesh.group("dp"))
        out["losses"].append(float(t) / dp)
        if save is not None and step + 1 == at:
            booster.save(model, opt, Path(save), step=at)
            full = gather_full_state_dict(model.module, mesh, values=model.full_state_dict())
            if dist.get_rank() == 0:
                out["full"] = {n: v.detach().clone() for n, v in full.items()}
    out["mesh"] = booster.memory_stats()["mesh"]
    plugin.close()
    return out
