"""Blocks that name a run of a saved 1-D tensor ([Note: one reader]): every part of every box of
a flat range reads the elements plain slicing of the whole tensor gives."""

from __future__ import annotations

import math
from contextlib import ExitStack

import pytest
import torch
from safetensors.torch import save_file

from colossal.checkpoint._layout_read import _Reader
from colossal_models.sharding import flat_range_boxes


@pytest.mark.parametrize(
    "shape,lo,hi",
    [((7, 5, 3), 8, 93), ((7, 5, 3), 0, 105), ((4, 6), 5, 6), ((9,), 2, 7), ((), 0, 1)],
)
def test_flat_blocks_read_what_slicing_the_whole_tensor_gives(tmp_path, shape, lo, hi):
    full = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    save_file({"run": full.reshape(-1)[lo:hi].clone()}, str(tmp_path / "f.safetensors"))
    strides = [math.prod(shape[d + 1 :]) for d in range(len(shape))]
    boxes = flat_range_boxes(shape, lo, hi)
    assert sum(b.numel for b in boxes) == hi - lo
    with ExitStack() as stack:
        reader = _Reader(tmp_path, stack)
        for box in boxes:
            start = sum(o * s for o, s in zip(box.offsets, strides, strict=True)) - lo
            want = full[box.slices()]
            parts = [tuple(slice(0, n) for n in box.sizes)]  # the whole box, and a corner of it
            if box.sizes and all(n > 1 for n in box.sizes):
                parts.append(tuple(slice(1, n) for n in box.sizes))
            for part in parts:
                got = reader.read("f.safetensors", "run", list(box.sizes), part, start)
                assert got is not None and torch.equal(got, want[part]), (box, part)
