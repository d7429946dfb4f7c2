"""Rank-side check of ``describe_sharding`` (run inside a colossal_testing World)."""

from __future__ import annotations

import copy
import math

import torch

from colossal_models import GPT, GPTConfig, parallelize
from colossal_models.sharding import describe_sharding
from colossal_parallel import MeshConfig, ProcessMesh


def pieces_cover_each_parameter_once(mode: str) -> dict[str, tuple[int, int, int]]:
    """Per parameter: (local numel x product of split-axis sizes, unsharded numel, number of
    replicated axes). The first two are equal when the split axes hold disjoint equal pieces."""
    import torch.distributed as dist

    depth = 2 if mode == "2.5d" else 1
    mesh = ProcessMesh(MeshConfig(tp=dist.get_world_size(), tp_mode=mode, tp_depth=depth))
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=64, max_seq_len=16, num_layers=1, num_heads=4, hidden_size=32)
    ref = GPT(cfg)
    full = {n: p.numel() for n, p in ref.named_parameters()}
    par = parallelize(copy.deepcopy(ref), mesh, mode)
    shardings = describe_sharding(par, mesh)
    out = {}
    for name, p in par.named_parameters():
        s = shardings[name]
        covered = p.numel() * math.prod(a.size for a in s.split)
        out[name] = (covered, full.get(name, covered), len(s.replicated))
    mesh.close()
    return out
