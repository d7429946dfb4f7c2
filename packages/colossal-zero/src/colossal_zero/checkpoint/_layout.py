"""The files of a sharded checkpoint and how rank 0 writes its index and buffers.

[Note: sharded checkpoint layout] A directory holds ``gemini-rank<R>-of-<W>.safetensors`` per
rank, with 1-D tensors ``param/<name>``, ``exp_avg/<name>``, ``exp_avg_sq/<name>`` and
``step/<name>`` for the elements of each parameter that rank's shard holds, and
``gemini_index.json``: per parameter its shape and the ``[rank, start, end]`` element ranges of
its flattened value in each file, the aliases of tied parameters, the loss scaler, and ``files``:
the SHA-256 and size of every shard file and the buffers file, checked when a file is first read
(a shard swapped in from another run of the same shape is named, not loaded). Buffers are in
``gemini-buffers.safetensors``. Values are fp32 (the masters), whatever the precision. Gemini
(``gemini/_checkpoint.py``) and ZeRO-1/2 (``low_level/_checkpoint.py``) write the same layout.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch import nn

from .._safetensors_stream import SafetensorsStream, TensorSpec
from ..optim._scaler import DynamicLossScaler

__all__ = [
    "BUFFERS_FILE",
    "FORMAT",
    "INDEX_FILE",
    "element_ranges",
    "file_digest",
    "gather_digests",
    "shard_file",
    "write_buffers",
    "write_index",
]

INDEX_FILE = "gemini_index.json"
BUFFERS_FILE = "gemini-buffers.safetensors"
FORMAT = 1


def file_digest(path: Path) -> dict[str, Any]:
    """``{"sha256": hex, "bytes": size}`` of a file, read into one reused 1 MiB buffer."""
    h = hashlib.sha256()
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as fh:
        while n := fh.readinto(buf):
            h.update(view[:n])
    return {"sha256": h.hexdigest(), "bytes": path.stat().st_size}


def shard_file(rank: int, world: int) -> str:
    """The name of rank ``rank``'s file in a checkpoint of ``world`` ranks."""
    return f"gemini-rank{rank:05d}-of-{world:05d}.safetensors"


def element_ranges(offset: int, end: int, shard_numel: int, world: int) -> list[list[int]]:
    """The ``[rank, start, end]`` ranges, in the tensor's flattened elements, of a tensor at
    elements ``[offset, end)`` of a flat buffer split into ``world`` shards of ``shard_numel``."""
    out = []
    for r in range(world):
        lo = r * shard_numel
        a, b = max(lo, offset), min(lo + shard_numel, end)
        if a < b:
            out.append([r, a - offset, b - offset])
    return out


def gather_digests(
    group: dist.ProcessGroup | None, name: str, digest: dict[str, Any]
) -> dict[str, Any]:
    """Every rank's ``{file name: digest}`` on every rank of ``group``. Collective."""
    if group is None or dist.get_world_size(group) == 1:
        return {name: digest}
    out: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, (name, digest), group=group)
    return dict(out)


def write_buffers(module: nn.Module, directory: Path) -> dict[str, Any]:
    """Stream ``module``'s buffers into the checkpoint's buffers file; returns its digest."""
    buffers = [(n, b.detach()) for n, b in module.named_buffers()]
    path = directory / BUFFERS_FILE
    with SafetensorsStream(path, [TensorSpec.of(n, b) for n, b in buffers]) as out:
        for _, b in buffers:
            out.write(b)
    return out.close()


def write_index(
    directory: Path,
    *,
    world: int,
    precision: str,
    params: dict[str, Any],
    aliases: dict[str, str],
    optimizer: bool,
    scaler: DynamicLossScaler | None,
    files: dict[str, Any],
    writer: str | None = None,
    frozen_omitted: list[str] | None = None,
) -> None:
    """Write ``gemini_index.json`` (rank 0, after every file is written and digested);
    ``frozen_omitted``: the frozen parameters left out ([Note: omitted frozen values] in
    ``_reader.py``), None when every value was written."""
    index: dict[str, Any] = {
        "format": FORMAT,
        "world_size": world,
        "precision": precision,
        "params": params,
        "aliases": aliases,
        "optimizer": optimizer,
        "scaler": scaler.state_dict() if scaler is not None else None,
    }
    if writer is not None:
        index["writer"] = writer
    if frozen_omitted is not None:
        index["frozen_omitted"] = frozen_omitted
    index["files"] = files
    (directory / INDEX_FILE).write_text(json.dumps(index, indent=1))
