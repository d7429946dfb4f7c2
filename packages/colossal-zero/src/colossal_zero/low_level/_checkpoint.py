"""Sharded checkpoints of ZeRO-1/2, in the layout Gemini's use ([Note: sharded checkpoint layout]
in ``checkpoint/_layout.py``): one safetensors file per data-parallel rank with the fp32 elements of
every parameter its bucket shards hold (``param/``, ``exp_avg/``, ``exp_avg_sq/``, ``step/``),
and an index of element ranges. Frozen parameters are written whole by rank 0 (or left out:
``frozen_values=False``, [Note: omitted frozen values] in ``checkpoint/_reader.py``). So a ZeRO
checkpoint loads into ZeRO at any data-parallel size, into Gemini (``load_sharded``), and
``consolidate`` exports it to a plain state dict; a Gemini checkpoint loads into ZeRO too.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file

from ..checkpoint._layout import (
    BUFFERS_FILE,
    element_ranges,
    file_digest,
    gather_digests,
    shard_file,
    write_buffers,
    write_index,
)
from ..checkpoint._reader import CheckpointReader, omitted_frozen
from ..optim._adam import STATE_KINDS
from ._optimizer import LowLevelZeroOptimizer

__all__ = ["load_zero_sharded", "save_zero_sharded"]


@torch.no_grad()
def save_zero_sharded(
    optimizer: LowLevelZeroOptimizer, directory: Path, *, frozen_values: bool = True
) -> None:
    """Write this rank's shard (rank 0 also the index, frozen parameters and buffers) into the
    existing ``directory``. Collective over the optimizer's data-parallel group.
    ``frozen_values=False`` leaves frozen parameters out ([Note: omitted frozen values])."""
    opt, world = optimizer, optimizer.world
    rank = dist.get_rank(opt.group) if opt.group is not None else 0
    tensors: dict[str, torch.Tensor] = {}
    params: dict[str, dict] = {}
    sd = opt.precision.state_dtype
    for b in opt.buckets:
        for name, rec in b.param.records.items():
            ranges = element_ranges(rec.offset, rec.end, b.param.shard_numel, world)
            params[name] = {"shape": list(rec.shape), "ranges": ranges}
            part = b.fp32.shard_view(name)
            if part is None:
                continue
            tensors[f"param/{name}"] = part[0].to(sd).cpu().clone()  # float64 under fp64
            for kind, chunk in zip(STATE_KINDS, (b.exp_avg, b.exp_avg_sq), strict=True):
                tensors[f"{kind}/{name}"] = chunk.shard_part(name).cpu().clone()
            if name in opt.steps:
                tensors[f"step/{name}"] = opt.steps[name].reshape(1).cpu().clone()
    trained = {n for b in opt.buckets for n in b.params}
    untrained = [n for n, _ in opt.model.named_parameters() if n not in trained]
    omitted = [] if frozen_values else sorted(untrained)
    for name, p in opt.model.named_parameters():  # frozen: whole, in rank 0's file
        if name not in trained and name not in omitted:
            params[name] = {"shape": list(p.shape), "ranges": [[0, 0, p.numel()]]}
            if rank == 0:
                tensors[f"param/{name}"] = p.detach().to(sd).reshape(-1).cpu().clone()
    shard = directory / shard_file(rank, world)
    save_file(tensors, str(shard))
    files = gather_digests(opt.group, shard.name, file_digest(shard))  # checked on load
    if rank == 0:
        files[BUFFERS_FILE] = write_buffers(opt.model, directory)
        aliases = {
            alias: opt.canonical_names[id(p)]
            for alias, p in opt.model.named_parameters(remove_duplicate=False)
        }
        write_index(
            directory,
            world=world,
            precision=opt.precision.name,
            params=params,
            aliases=aliases,
            optimizer=True,
            scaler=opt.scaler,
            files=files,
            writer=f"zero{opt.config.stage}",
            frozen_omitted=None if frozen_values else omitted,
        )


@torch.no_grad()
def load_zero_sharded(optimizer: LowLevelZeroOptimizer, directory: Path) -> None:
    """Restore a ZeRO or Gemini sharded checkpoint of any data-parallel size into this rank's
    shards, then all-gather the parameters. ``CheckpointError`` on a missing or foreign file."""
    reader = CheckpointReader(directory)
    opt, index = optimizer, reader.index
    sd = opt.precision.state_dtype
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
            p.copy_(reader.read_saved("param", name, 0, p.numel(), sd).view(p.shape))
    for b in opt.buckets:
        for name in b.params:
            part = b.fp32.shard_view(name)
            if part is None:
                continue
            view, lo, hi = part
            view.copy_(reader.read_saved("param", name, lo, hi, sd))
            if not index["optimizer"]:
                continue
            for kind, chunk in zip(STATE_KINDS, (b.exp_avg, b.exp_avg_sq), strict=True):
                value = reader.read(kind, name, lo, hi, sd)
                if value is not None:
                    chunk.shard_part(name).copy_(value)
            reader.restore_step(opt.steps, name)
    opt.refresh_params()
    opt.zero_grad()
    reader.restore_scaler(opt.scaler)
    reader.load_buffers(opt.model)
