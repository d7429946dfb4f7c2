"""Rank-side check of ``shard_map`` (run inside a colossal_testing World)."""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist

from colossal_models import GPT, GPTConfig, PaLM, PaLMConfig, parallelize
from colossal_models.sharding import shard_map
from colossal_parallel import MeshConfig, ProcessMesh


def _model(kind: str, bias: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "palm":
        return PaLM(
            PaLMConfig(vocab_size=64, max_seq_len=16, num_layers=1, num_heads=4, hidden_size=32)
        )
    cfg = GPTConfig(
        vocab_size=64, max_seq_len=16, num_layers=1, num_heads=4, hidden_size=32, bias=bias
    )
    return GPT(cfg)


def pieces_rebuild_every_shard(mode: str, kind: str, bias: bool) -> dict:
    """Each local shard rebuilt from the unsharded weights through its pieces; returns, per
    parameter, (exact match, pieces, global boxes held here, unsharded name) for the test to check coverage."""
    mesh = ProcessMesh(MeshConfig(tp=dist.get_world_size(), tp_mode=mode))
    ref = _model(kind, bias)
    full = dict(ref.named_parameters())
    par = parallelize(copy.deepcopy(ref), mesh, mode)
    maps = shard_map(par, mesh)
    out = {}
    for name, p in par.named_parameters():
        m = maps[name]
        if not m.pieces:
            out[name] = (name not in full and not p.requires_grad, 0, [], m.name)
            continue
        rebuilt = torch.full_like(p, float("nan"))
        for piece in m.pieces:
            g = piece.to_global(piece.local)
            rebuilt[piece.local.slices()] = piece.local_view(full[m.name].detach()[g.slices()])
        boxes = [(b.offsets, b.sizes) for b in (q.to_global(q.local) for q in m.pieces)]
        out[name] = (bool(torch.equal(rebuilt, p.detach())), len(m.pieces), boxes, m.name)
    mesh.close()
    out["_pieces"] = {n: len(m.pieces) for n, m in maps.items()}
    return out
