"""Reading the layout-independent checkpoint ([Note: layout checkpoint] in
``_hybrid_checkpoint``): its index, slices of its safetensors files, and the unsharded tensors
one at a time."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from colossal_contracts import CheckpointError
from colossal_models import Box

__all__ = ["LAYOUT_FORMAT", "LAYOUT_INDEX", "iter_full_tensors", "read_layout_index"]

LAYOUT_FORMAT = "colossal-layout/1"
LAYOUT_INDEX = "layout_index.json"


def read_layout_index(directory: Path) -> dict[str, Any]:
    """The checked ``layout_index.json`` of ``directory``; ``CheckpointError`` when it is
    absent, unreadable or of another format."""
    path = Path(directory) / LAYOUT_INDEX
    try:
        index = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(
            f"{directory} has no readable {LAYOUT_INDEX} ({err}); it is not a layout-independent "
            "checkpoint (written by HybridParallelPlugin), or it is damaged"
        ) from err
    if not isinstance(index, dict) or index.get("format") != LAYOUT_FORMAT:
        got = index.get("format") if isinstance(index, dict) else type(index).__name__
        raise CheckpointError(f"{path}: format {got!r}, expected {LAYOUT_FORMAT!r}")
    for k in ("params", "tensors", "steps"):
        if not isinstance(index.get(k), dict):
            raise CheckpointError(f"{path}: {k!r} must be an object; the index was edited")
    return index


class _Reader:
    """Slices of the checkpoint's safetensors files, each opened once."""

    def __init__(self, directory: Path, stack: ExitStack) -> None:
        self.directory, self.stack = Path(directory), stack
        self.files: dict[str, Any] = {}

    def read(self, file: str, key: str, sizes: list[int], part: tuple[slice, ...]) -> torch.Tensor:
        where = f"{self.directory / file} [{key}]"
        try:
            f = self.files.get(file)
            if f is None:
                f = self.files[file] = self.stack.enter_context(
                    safe_open(str(self.directory / file), framework="pt")
                )
            sl = f.get_slice(key)
            if list(sl.get_shape()) != list(sizes):
                raise CheckpointError(f"{where} has shape {sl.get_shape()}, the index says {sizes}")
            return sl[part]
        except (OSError, SafetensorError) as err:
            raise CheckpointError(f"checkpoint file {where} is missing or corrupt: {err}") from err


def _fill(reader: _Reader, saved: list, box: Box, out: torch.Tensor, what: str) -> None:
    """Copy the saved blocks' overlap with ``box`` into ``out`` (``box``'s elements)."""
    got = 0
    for file, key, offsets, sizes in saved:
        src = Box(tuple(offsets), tuple(sizes))
        inter = box.intersect(src)
        if inter is None:
            continue
        data = reader.read(file, key, sizes, inter.slices(src.offsets))
        out[inter.slices(box.offsets)].copy_(data)
        got += inter.numel
    if got != box.numel:
        raise CheckpointError(
            f"{reader.directory}: the saved blocks of {what} cover {got} of the {box.numel} "
            f"elements at {list(box.offsets)}+{list(box.sizes)}; the checkpoint is incomplete"
        )


def iter_full_tensors(path: Path, kind: str = "param") -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, unsharded fp32 tensor)`` of every parameter, one at a time (for export)."""
    index = read_layout_index(Path(path))
    with ExitStack() as stack:
        reader = _Reader(Path(path), stack)
        for name, rec in index["params"].items():
            shape = tuple(rec["shape"])
            out = torch.empty(shape, dtype=torch.float32)
            blocks = index["tensors"].get(kind, {}).get(name, [])
            _fill(reader, blocks, Box((0,) * len(shape), shape), out, f"{kind} of {name!r}")
            yield name, out
