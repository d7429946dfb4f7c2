"""``shard_map`` (where each shard's elements live in the unsharded model) and its box
geometry: rebuilt shards equal the plan's own shards exactly, in 1d and 2d, and the ranks'
pieces cover every parameter."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

from colossal_models import GPT, GPTConfig
from colossal_models.sharding import Box, ShardMap, flat_range_boxes, shard_map

sys.path.insert(0, str(Path(__file__).parent))
import _checks_shard_map as checks


@pytest.mark.parametrize(
    "shape,lo,hi",
    [((10,), 3, 7), ((4, 5), 0, 20), ((4, 5), 3, 17), ((3, 4, 5), 7, 53), ((3, 4, 5), 20, 40)],
)
def test_flat_range_boxes_are_the_range_in_order(shape, lo, hi):
    flat = torch.arange(math.prod(shape)).view(shape)
    boxes = flat_range_boxes(shape, lo, hi)
    got = torch.cat([flat[b.slices()].reshape(-1) for b in boxes])
    assert torch.equal(got, torch.arange(lo, hi))
    assert len(boxes) <= 2 * len(shape) - 1


def test_box_subtract_and_intersect():
    a, b = Box((0, 0), (4, 6)), Box((1, 2), (2, 10))
    assert a.intersect(b) == Box((1, 2), (2, 4))
    parts = a.subtract(b)
    cover = torch.zeros(4, 6, dtype=torch.int64)
    for p in parts:
        cover[p.slices()] += 1
    cover[a.intersect(b).slices()] += 1  # type: ignore[union-attr]
    assert bool((cover == 1).all())
    assert a.intersect(Box((4, 0), (1, 6))) is None
    assert a.subtract(Box((9, 9), (1, 1))) == [a]


def test_unsharded_map_is_whole():
    model = GPT(GPTConfig(vocab_size=64, max_seq_len=16, num_layers=1, num_heads=4, hidden_size=32))
    maps = shard_map(model, None)
    assert set(maps) == {n for n, _ in model.named_parameters()}
    assert maps["wte.weight"] == ShardMap.whole("wte.weight", (64, 32))


@pytest.mark.parametrize(
    "mode,kind,bias", [("1d", "gpt", True), ("2d", "gpt", False), ("1d", "palm", False)]
)
def test_pieces_rebuild_shards_and_cover_the_model(world, mode, kind, bias):
    out = world(4).run(checks.pieces_rebuild_every_shard, mode, kind, bias)
    for per_rank in out:
        counts = per_rank.pop("_pieces")
        assert all(r[0] for r in per_rank.values()), per_rank
        assert max(counts.values()) <= 3, counts  # few pieces: blocks, not elements
    if kind == "gpt":
        assert out[0]["blocks.0.attn.qkv.weight"][1] == 3  # q, k and v rows of its heads
    model = checks._model(kind, bias)
    seen = {n: torch.zeros(p.shape, dtype=torch.bool) for n, p in model.named_parameters()}
    for per_rank in out:
        for _, _, boxes, name in per_rank.values():
            for offsets, sizes in boxes:
                seen[name][Box(offsets, sizes).slices()] = True
    assert all(bool(s.all()) for s in seen.values()), [n for n, s in seen.items() if not s.all()]
