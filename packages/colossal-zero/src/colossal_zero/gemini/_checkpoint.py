"""Gemini's sharded checkpoints ([Note: sharded checkpoint layout] in ``checkpoint/_layout.py``):
every rank writes its shard of the fp32 weights and Adam states, rank 0 the index and buffers;
loads into any data-parallel size ([Note: whole or not at all] in ``checkpoint/_reader.py``).

Saving and loading go chunk by chunk: a rank's file is streamed from its shards (its header is
computed from the chunk records first, [Note: streamed safetensors]) and hashed while written;
loading ``pread``s each parameter's element ranges from the files straight into its shard
(``SafetensorsRangeReader``: no file is mapped). No step holds more than one tensor beyond the
chunks themselves.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from .._safetensors_stream import SafetensorsStream, TensorSpec
from ..checkpoint._layout import (
    BUFFERS_FILE,
    element_ranges,
    gather_digests,
    shard_file,
    write_buffers,
    write_index,
)
from ..checkpoint._reader import CheckpointReader, omitted_frozen
from ..optim._adam import STATE_KINDS
from ._module import GeminiModule
from ._optimizer import GeminiOptimizer

__all__ = ["load_sharded", "save_sharded"]


def _rank_world(model: GeminiModule) -> tuple[int, int]:
    g = model.runtime.group
    return (dist.get_rank(g), dist.get_world_size(g)) if g is not None else (0, 1)


def _fp32_chunk(model: GeminiModule, c: Any) -> Any:
    rt = model.runtime
    return rt.roles.fp32(c)


_Item = tuple[TensorSpec, Callable[[], torch.Tensor]]  # what to write, how to read it then


def _plan_shard(
    model: GeminiModule, optimizer: GeminiOptimizer | None, world: int, frozen_values: bool = True
) -> tuple[dict[str, Any], list[tuple[list[Any], list[_Item]]]]:
    """The index's ``params`` entries and, per parameter chunk, the chunks its values live in
    and the tensors this rank writes from them (specs from the records: no value is read);
    frozen chunks left out unless ``frozen_values`` ([Note: omitted frozen values])."""
    m = model.runtime.manager
    sd = model.runtime.precision.state_dtype  # fp32 values, float64 under fp64
    params: dict[str, Any] = {}
    groups: list[tuple[list[Any], list[_Item]]] = []
    for rec in m.groups.values():
        c = rec.param
        if c.frozen and not frozen_values:
            continue
        fp32 = _fp32_chunk(model, c)
        with_states = optimizer is not None and not c.frozen  # frozen: values only
        states = [rec.twin(k) for k in STATE_KINDS] if with_states else []
        items: list[_Item] = []
        for name, rec in c.records.items():
            ranges = element_ranges(rec.offset, rec.end, c.shard_numel, world)
            params[name] = {"shape": list(rec.shape), "ranges": ranges}
            part = fp32.shard_view(name)
            if part is None:
                continue
            numel = part[2] - part[1]
            for kind, chunk in [("param", fp32), *zip(STATE_KINDS, states)]:
                spec = TensorSpec(f"{kind}/{name}", sd, (numel,))
                items.append((spec, lambda ch=chunk, n=name: ch.shard_view(n)[0].to(sd)))
            if optimizer is not None and name in optimizer.steps:
                spec = TensorSpec(f"step/{name}", torch.float32, (1,))
                items.append((spec, lambda n=name: optimizer.steps[n].reshape(1).float()))
        groups.append(([fp32, *states], items))
    return params, groups


@torch.no_grad()
def save_sharded(
    model: GeminiModule,
    optimizer: GeminiOptimizer | None,
    directory: Path,
    *,
    frozen_values: bool = True,
) -> None:
    """Write this rank's shard (and, on rank 0, the index and buffers) into ``directory``, which
    must exist. Every rank of the model's group calls it; see [Note: sharded checkpoint layout].
    ``frozen_values=False`` leaves frozen parameters out ([Note: omitted frozen values]).

    Streams ([Note: streamed safetensors]): the file's header comes from the chunk records, then
    the values are written chunk by chunk straight from their shards; a chunk on the disk tier is
    read ahead while the one before it is written and its pages are let go after, one on the
    accelerator is copied to the host one tensor at a time. Host memory beyond the chunks
    themselves: one tensor (none on the host tier)."""
    rt, m = model.runtime, model.runtime.manager
    rank, world = _rank_world(model)
    params, groups = _plan_shard(model, optimizer, world, frozen_values)
    shard = directory / shard_file(rank, world)
    specs = [spec for _, items in groups for spec, _ in items]
    with SafetensorsStream(shard, specs) as out:
        for i, (chunks, items) in enumerate(groups):
            if i + 1 < len(groups):
                m.shard_io.read_ahead(groups[i + 1][0])
            for _, value in items:
                out.write(value())
            m.shard_io.read_done(chunks)  # disk pages read here leave this process's memory
    files = gather_digests(rt.group, shard.name, out.close())
    if rank == 0:
        files[BUFFERS_FILE] = write_buffers(model.module, directory)
        write_index(
            directory,
            world=world,
            precision=rt.precision.name,
            params=params,
            aliases=rt.aliases,
            optimizer=optimizer is not None,
            scaler=optimizer.scaler if optimizer is not None else None,
            files=files,
            frozen_omitted=None
            if frozen_values
            else sorted(n for g in m.groups.values() if g.param.frozen for n in g.param.records),
        )


@torch.no_grad()
def load_sharded(model: GeminiModule, optimizer: GeminiOptimizer | None, directory: Path) -> None:
    """Restore what ``save_sharded`` wrote, from any data-parallel size, into this rank's shards.
    ``CheckpointError`` when files are missing or do not match the model."""
    reader = CheckpointReader(directory)
    rt, m = model.runtime, model.runtime.manager
    index = reader.index
    mine = []
    frozen = {n for n, p in model.module.named_parameters() if not p.requires_grad}
    omitted = omitted_frozen(index, frozen, directory)  # [Note: omitted frozen values]
    for c in (g.param for g in m.groups.values()):  # shapes first, then [Note: whole or not
        for name, rec in c.records.items():  # at all]: nothing read yet
            if name in omitted:
                continue
            reader.check_shape(name, list(rec.shape))
            mine.append(name)
    with_state = optimizer is not None and index["optimizer"]
    reader.check_whole([n for n in mine if n not in frozen], optimizer=with_state)
    reader.check_whole([n for n in mine if n in frozen], optimizer=False)
    for group in m.groups.values():
        c = group.param
        if c.frozen and omitted.issuperset(c.records):
            continue  # its values stay the model's
        fp32 = _fp32_chunk(model, c)
        states = [] if c.frozen or optimizer is None else [group.twin(k) for k in STATE_KINDS]
        if c.frozen:  # loaded into its shard: a gathered copy would go stale
            rt.restore_params(c)
        for name in c.records:
            if optimizer is not None and index["optimizer"]:
                # every rank counts every tensor's steps (chunks may be re-packed later)
                reader.restore_step(optimizer.steps, name)
            part = fp32.shard_view(name)
            if part is None:
                continue
            view, a, _ = part
            reader.read_into("param", name, a, view)  # straight into the shard
            if not states or not index["optimizer"]:
                continue
            for kind, chunk in zip(STATE_KINDS, states, strict=True):
                reader.read_into(kind, name, a, chunk.shard_part(name))
        if rt.precision.master and not c.frozen:
            rt.restore_params(c)
        # chunk by chunk: what was written into chunks on disk is written out of memory
        m.shard_io.written(dict.fromkeys([c, fp32, *states]))
    rt.clear_grads()
    reader.restore_scaler(optimizer.scaler if optimizer is not None else None)
    reader.close()
    reader.load_buffers(model.module)
