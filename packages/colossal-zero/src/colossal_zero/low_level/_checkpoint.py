"""Sharded checkpoints of ZeRO-1/2, in the same family as Gemini's (see [Note: sharded checkpoint
layout] in ``gemini/_checkpoint.py``): one safetensors file per data-parallel rank with the fp32 elements of
every parameter its bucket shards hold (``param/``, ``exp_avg/``, ``exp_avg_sq/``, ``step/``),
and an index of element ranges. Frozen parameters are written whole by rank 0 (or left out:
``frozen_values=False``). So a ZeRO
checkpoint loads into ZeRO at any data-parallel size, into Gemini (``load_sharded``), and
``consolidate`` exports it to a plain state dict; a Gemini checkpoint loads into ZeRO too.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file

from ..gemini._checkpoint import (
    BUFFERS_FILE,
    FORMAT,
    INDEX_FILE,
    _Reader,
    _shard_file,
    file_digest,
    omitted_frozen,
)
from ._optimizer import LowLevelZeroOptimizer

__all__ = ["load_zero_sharded", "save_zero_sharded"]

_KINDS = ("exp_avg", "exp_avg_sq")


def _ranges(rec_offset: int, rec_end: int, shard_numel: int, world: int) -> list[list[int]]:
    out = []
    for r in range(world):
        lo = r * shard_numel
        a, b = max(lo, rec_offset), min(lo + shard_numel, rec_end)
        if a < b:
            out.append([r, a - rec_offset, b - rec_offset])
    return out


@torch.no_grad()
def save_zero_sharded(
    optimizer: LowLevelZeroOptimizer, directory: Path, *, frozen_values: bool = True
) -> None:
    """Write this rank's shard (rank 0 also the index, frozen parameters and buffers) into the
    existing ``directory``. Collective over the optimizer's data-parallel group.
    ``frozen_values=False`` leaves frozen parameters out (Gemini's [Note: omitted frozen
    values])."""
    opt, world = optimizer, optimizer.world
    rank = dist.get_rank(opt.group) if opt.group is not None else 0
    tensors: dict[str, torch.Tensor] = {}
    params: dict[str, dict] = {}
    for b in opt.buckets:
        for name, rec in b.param.records.items():
            ranges = _ranges(rec.offset, rec.end, b.param.shard_numel, world)
            params[name] = {"shape": list(rec.shape), "ranges": ranges}
            part = b.fp32.shard_view(name)
            if part is None:
                continue
            tensors[f"param/{name}"] = part[0].float().cpu().clone()
            for kind, chunk in zip(_KINDS, (b.exp_avg, b.exp_avg_sq), strict=True):
                tensors[f"{kind}/{name}"] = chunk.shard_view(name)[0].cpu().clone()  # type: ignore[index]
            if name in opt.steps:
                tensors[f"step/{name}"] = opt.steps[name].reshape(1).cpu().clone()
    trained = {n for b in opt.buckets for n in b.params}
    untrained = [n for n, _ in opt.model.named_parameters() if n not in trained]
    omitted = [] if frozen_values else sorted(untrained)
    for name, p in opt.model.named_parameters():  # frozen: whole, in rank 0's file
        if name not in trained and name not in omitted:
            params[name] = {"shape": list(p.shape), "ranges": [[0, 0, p.numel()]]}
            if rank == 0:
                tensors[f"param/{name}"] = p.detach().float().reshape(-1).cpu().clone()
    shard = directory / _shard_file(rank, world)
    save_file(tensors, str(shard))
    files: dict = {shard.name: file_digest(shard)}  # every rank's file, checked on load
    if opt.group is not None and world > 1:
        every: list = [None] * world
        dist.all_gather_object(every, (shard.name, files[shard.name]), group=opt.group)
        files = dict(every)
    if rank == 0:
        buffers = {n: t.detach().cpu().contiguous() for n, t in opt.model.named_buffers()}
        save_file(buffers, str(directory / BUFFERS_FILE))
        files[BUFFERS_FILE] = file_digest(directory / BUFFERS_FILE)
        aliases = {
            alias: opt.canonical_names[id(p)]
            for alias, p in opt.model.named_parameters(remove_duplicate=False)
        }
        index = {
            "format": FORMAT,
            "world_size": world,
            "precision": opt.precision.name,
            "params": params,
            "aliases": aliases,
            "optimizer": True,
            "scaler": opt.scaler.state_dict() if opt.scaler is not None else None,
            "writer": f"zero{opt.config.stage}",
            "files": files,
        }
        if not frozen_values:
            index["frozen_omitted"] = omitted
        (directory / INDEX_FILE).write_text(json.dumps(index, indent=1))


@torch.no_grad()
def load_zero_sharded(optimizer: LowLevelZeroOptimizer, directory: Path) -> None:
    """Restore a ZeRO or Gemini sharded checkpoint of any data-parallel size into this rank's
    shards, then all-gather the parameters. ``CheckpointError`` on a missing or foreign file."""
    reader = _Reader(directory)
    opt, index = optimizer, reader.index
    trained = {n for b in opt.buckets for n in b.params}
    untrained = {n for n, _ in opt.model.named_parameters() if n not in trained}
    omitted = omitted_frozen(index, untrained, directory)  # the model's values stay
    for name, p in opt.model.named_parameters():
        if name not in omitted:
            reader.check_shape(name, list(p.shape))
    # [Note: whole or not at all]: every value this load reads is proved present first
    frozen = [n for n in untrained if n not in omitted]
    reader.check_whole(sorted(trained), optimizer=index["optimizer"])
    reader.check_whole(frozen, optimizer=False)
    for name, p in opt.model.named_parameters():
        if name not in trained and name not in omitted:
            value = reader.read("param", name, 0, p.numel())
            p.copy_(value.view(p.shape))  # type: ignore[union-attr]
    for b in opt.buckets:
        for name in b.params:
            part = b.fp32.shard_view(name)
            if part is None:
                continue
            view, lo, hi = part
            view.copy_(reader.read("param", name, lo, hi))  # type: ignore[arg-type]
            if not index["optimizer"]:
                continue
            for kind, chunk in zip(_KINDS, (b.exp_avg, b.exp_avg_sq), strict=True):
                value = reader.read(kind, name, lo, hi)
                if value is not None:
                    chunk.shard_view(name)[0].copy_(value)  # type: ignore[index]
            step = reader.step(name)
            if step is not None:
                opt.steps[name] = torch.tensor(step, dtype=torch.float32)
    opt.refresh_params()
    opt.zero_grad()
    reader.restore_scaler(opt.scaler)
    reader.load_buffers(opt.model)
