"""Reading the layout-independent checkpoint ([Note: layout checkpoint] in
``_layout``): its index, slices of its safetensors files, and the unsharded tensors
one at a time.

A block is ``[file, key, offsets, sizes]`` (``key`` is a tensor of shape ``sizes``) or, for
checkpoints whose files hold runs of flattened tensors (the older formats read through
``_layout_legacy``), ``[file, key, offsets, sizes, start]``: ``key`` is 1-D and the block's
elements, in row-major order, are ``key[start : start + prod(sizes)]``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from colossal_contracts import CheckpointError
from colossal_models.sharding import Box
from colossal_zero.checkpoint import file_digest

__all__ = [
    "KINDS",
    "LAYOUT_FORMAT",
    "LAYOUT_INDEX",
    "check_layout_index",
    "iter_full_tensors",
    "layout_index_fault",
    "read_layout_index",
]

LAYOUT_FORMAT = "colossal-layout/1"
LAYOUT_INDEX = "layout_index.json"
KINDS = ("param", "exp_avg", "exp_avg_sq")  # what each parameter saves


def read_layout_index(directory: Path) -> dict[str, Any]:
    """The checked ``layout_index.json`` of ``directory``; ``CheckpointError`` when it is
    absent, unreadable or of another format."""
    path = Path(directory) / LAYOUT_INDEX
    try:
        index = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(
            f"{directory} has no readable {LAYOUT_INDEX} ({err}); it is not a layout-independent "
            "checkpoint (written by the hybrid plugin or Gemini with a mesh), or it is damaged"
        ) from err
    if not isinstance(index, dict) or index.get("format") != LAYOUT_FORMAT:
        got = index.get("format") if isinstance(index, dict) else type(index).__name__
        raise CheckpointError(f"{path}: format {got!r}, expected {LAYOUT_FORMAT!r}")
    check_layout_index(index, path)
    return index


def check_layout_index(index: dict[str, Any], path: Path) -> None:
    """``CheckpointError`` (naming ``path``, where the index came from) unless every kind of
    every parameter is covered by disjoint blocks inside its shape, every element once
    ([Note: whole or not at all])."""
    for k in ("params", "tensors", "steps"):
        if not isinstance(index.get(k), dict):
            raise CheckpointError(f"{path}: {k!r} must be an object; the index was edited")
    fault = layout_index_fault(index)
    if fault:
        raise CheckpointError(
            f"{path}: {fault}; the index was edited or the checkpoint is incomplete: resume "
            "from another checkpoint"
        )


def layout_index_fault(index: dict[str, Any]) -> str | None:
    """The first tensor whose blocks do not cover it exactly once, in words (parameter, kind
    and the elements missing or doubled); None when every one does. ``index`` has the
    ``params``, ``tensors`` and ``steps`` objects of ``layout_index.json``."""
    for name, meta in index["params"].items():
        for kind in KINDS:
            if kind != "param" and name not in index["steps"]:
                continue  # no optimizer state saved for it
            fault = _cover_fault(meta, index["tensors"].get(kind, {}).get(name))
            if fault:
                return f"the blocks of {kind} of {name!r} {fault}"
    return None


def _cover_fault(meta: Any, blocks: Any) -> str | None:
    """What keeps ``blocks`` from covering ``meta``'s shape exactly once (None when they do)."""
    shape = meta.get("shape") if isinstance(meta, dict) else None
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        return "belong to an entry without a valid 'shape'"
    if not isinstance(blocks, list):
        return f"are absent (none of its {math.prod(shape)} elements is saved)"
    boxes = []
    for b in blocks:
        ok = isinstance(b, list) and len(b) in (4, 5) and isinstance(b[2], list)
        ok = ok and isinstance(b[3], list) and len(b[2]) == len(b[3]) == len(shape)
        if not ok or not all(isinstance(v, int) and v >= 0 for v in [*b[2], *b[3], *b[4:]]):
            return f"include {b!r}, not [file, key, offsets, sizes(, start)] of the tensor's rank"
        if any(o + n > d for o, n, d in zip(b[2], b[3], shape, strict=True)):
            return f"include {b[2]}+{b[3]}, outside the shape {shape}"
        boxes.append(Box(tuple(b[2]), tuple(b[3])))
    overlap = _first_overlap(boxes)
    if overlap is not None:
        return f"overlap at {list(overlap.offsets)}"
    covered = sum(b.numel for b in boxes)
    if covered != math.prod(shape):
        gaps = _missing(shape, boxes)
        return f"cover {covered} of its {math.prod(shape)} elements (missing: {gaps})"
    return None


def _first_overlap(boxes: list[Box]) -> Box | None:
    """The common part of the first two boxes (by start along dim 0) that overlap, or None: a
    sweep along dim 0 compares each box only with those starting before it ends there (row runs
    and tp blocks: near-linear; all pairs was 18 s for 4,096 blocks of one tensor)."""
    order = sorted(boxes, key=lambda b: b.offsets)
    for i, a in enumerate(order):
        for c in order[i + 1 :]:
            if a.offsets and c.offsets[0] >= a.offsets[0] + a.sizes[0]:
                break  # c and every later box start past a's end along dim 0
            inter = a.intersect(c)
            if inter is not None and inter.numel:
                return inter
    return None


def _missing(shape: list[int], boxes: list[Box]) -> str:
    """The blocks of ``shape`` that no box covers, as ``offsets+sizes`` (the first three)."""
    gaps = [Box((0,) * len(shape), tuple(shape))]
    for b in boxes:
        gaps = [g for gap in gaps for g in gap.subtract(b)]
    more = f" and {len(gaps) - 3} more" if len(gaps) > 3 else ""
    return ", ".join(f"{list(g.offsets)}+{list(g.sizes)}" for g in gaps[:3]) + more


class _Reader:
    """Slices of the checkpoint's safetensors files, each opened once; ``digests`` (file name
    -> ``file_digest``), when given, are checked as each file is first opened."""

    def __init__(
        self, directory: Path, stack: ExitStack, digests: dict[str, Any] | None = None
    ) -> None:
        self.directory, self.stack = Path(directory), stack
        self.files: dict[str, Any] = {}
        self.digests = digests or {}

    def check(self, file: str, key: str, sizes: list[int], start: int | None = None) -> None:
        """``CheckpointError`` unless ``file`` holds ``key`` of shape ``sizes`` (with ``start``:
        a 1-D ``key`` holding ``prod(sizes)`` elements from ``start``); header only."""
        self.read(file, key, sizes, None, start)

    def open(self, file: str) -> Any:
        """The safetensors handle of ``file`` (checksum checked on first open)."""
        f = self.files.get(file)
        if f is None:
            want = self.digests.get(file)
            if want is not None and file_digest(self.directory / file) != want:
                raise CheckpointError(
                    f"checkpoint file {self.directory / file} does not match the checksum in "
                    "its index: it was changed or copied from another checkpoint; restore the "
                    "original file"
                )
            f = self.files[file] = self.stack.enter_context(
                safe_open(str(self.directory / file), framework="pt")
            )
        return f

    def read(
        self,
        file: str,
        key: str,
        sizes: list[int],
        part: tuple[slice, ...] | None,
        start: int | None = None,
    ) -> torch.Tensor | None:
        where = f"{self.directory / file} [{key}]"
        try:
            f = self.open(file)
            if key not in f.keys():  # noqa: SIM118 (safe_open has no __contains__)
                raise CheckpointError(f"{where} is absent from its file, and the index names it")
            sl = f.get_slice(key)
            shape, numel = list(sl.get_shape()), math.prod(sizes)
            if start is None and shape != list(sizes):
                raise CheckpointError(f"{where} has shape {shape}, the index says {sizes}")
            if start is not None and (len(shape) != 1 or shape[0] < start + numel):
                raise CheckpointError(
                    f"{where} has shape {shape}, the index reads elements "
                    f"[{start}, {start + numel}) of it"
                )
            if part is None:
                return None
            if start is None:
                return sl[part]
            if not sizes:  # a scalar
                return sl[start : start + 1].reshape(())
            # only the rows of the block that ``part`` takes: a contiguous run of the 1-D tensor
            rows, inner = part[0].indices(sizes[0]), math.prod(sizes[1:])
            run = sl[start + rows[0] * inner : start + rows[1] * inner]
            return run.reshape(rows[1] - rows[0], *sizes[1:])[(slice(None), *part[1:])]
        except (OSError, SafetensorError) as err:
            raise CheckpointError(f"checkpoint file {where} is missing or corrupt: {err}") from err


def _fill(reader: _Reader, saved: list, box: Box, out: torch.Tensor, what: str) -> None:
    """Copy the saved blocks' overlap with ``box`` into ``out`` (``box``'s elements)."""
    got = 0
    for file, key, offsets, sizes, *start in saved:
        src = Box(tuple(offsets), tuple(sizes))
        inter = box.intersect(src)
        if inter is None:
            continue
        data = reader.read(file, key, sizes, inter.slices(src.offsets), *start)
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
