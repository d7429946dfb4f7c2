"""``ShardedSafetensorsWriter``: shards of bounded size, the Hugging Face index written last,
nothing published when the export fails."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from colossal.booster import HF_INDEX, ShardedSafetensorsWriter
from colossal_contracts import ConfigError


def test_shards_are_bounded_and_indexed(tmp_path):
    tensors = {f"t{i}": torch.full((10 * (i + 1),), float(i)) for i in range(6)}
    tensors["big"] = torch.arange(500, dtype=torch.float32)  # 2000 bytes: a shard of its own
    with ShardedSafetensorsWriter(tmp_path, max_shard_bytes=400) as w:
        for name, t in tensors.items():
            w.add(name, t)
    index = json.loads((tmp_path / HF_INDEX).read_text())
    files = sorted(set(index["weight_map"].values()))
    assert files == [
        f"model-{i:05d}-of-{len(files):05d}.safetensors" for i in range(1, len(files) + 1)
    ]
    assert index["metadata"]["total_size"] == sum(t.numel() * 4 for t in tensors.values())
    got: dict[str, torch.Tensor] = {}
    for f in files:
        part = load_file(str(tmp_path / f))
        assert len(part) == 1 or sum(t.numel() * 4 for t in part.values()) <= 400
        assert all(index["weight_map"][n] == f for n in part)
        got.update(part)
    assert set(got) == set(tensors) and all(torch.equal(got[n], t) for n, t in tensors.items())
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_a_failed_export_leaves_no_index_and_no_shards(tmp_path):
    with pytest.raises(RuntimeError), ShardedSafetensorsWriter(tmp_path, max_shard_bytes=8) as w:
        w.add("a", torch.zeros(4))
        w.add("b", torch.zeros(4))
        raise RuntimeError("disk full")
    assert list(tmp_path.iterdir()) == []


def test_bad_settings_and_duplicates_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="max_shard_bytes"):
        ShardedSafetensorsWriter(tmp_path, max_shard_bytes=0)
    w = ShardedSafetensorsWriter(tmp_path, max_shard_bytes=100)
    w.add("a", torch.zeros(2))
    with pytest.raises(ConfigError, match="twice"):
        w.add("a", torch.zeros(2))


def test_each_tensor_is_on_disk_when_add_returns_and_none_is_kept(tmp_path):
    """The writer streams ([Note: streamed export]): after ``add`` the tensor's bytes are in the
    open shard's file and the writer keeps no reference to it (so it holds one tensor at most)."""
    import weakref

    w = ShardedSafetensorsWriter(tmp_path, max_shard_bytes=20_000)
    alive = []
    for i in range(5):
        t = torch.full((500,), float(i))  # 2000 bytes
        w.add(f"t{i}", t)
        alive.append(weakref.ref(t))
        part = next(tmp_path.glob(".model-part*.tmp"))
        assert part.stat().st_size >= w._room + 2000 * (i + 1)
        del t  # the last reference here: freed now unless the writer kept one
        assert all(r() is None for r in alive)
    w.add("bf16", torch.arange(7, dtype=torch.bfloat16))
    w.close()
    got = load_file(str(tmp_path / "model-00001-of-00001.safetensors"))
    assert torch.equal(got["t3"], torch.full((500,), 3.0))
    assert torch.equal(got["bf16"], torch.arange(7, dtype=torch.bfloat16))


def test_a_shard_closes_when_its_header_room_is_full(tmp_path):
    with ShardedSafetensorsWriter(tmp_path, max_shard_bytes=100_000) as w:
        room = w._room  # 4 KiB: far less than the data bound
        for i in range(room // 40):  # each entry takes more than 40 header bytes
            w.add(f"layer.{i}.weight", torch.zeros(1))
    index = json.loads((tmp_path / HF_INDEX).read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) >= 2
    assert sum(len(load_file(str(tmp_path / f))) for f in files) == room // 40
