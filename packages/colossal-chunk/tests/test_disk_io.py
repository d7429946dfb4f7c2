"""The disk tier's background I/O and its checks: write-behind and read-ahead keep every byte,
count what they move, and a directory that cannot hold the budget is a one-line ConfigError."""

import ctypes
import mmap
import shutil

import pytest
import torch

from colossal_chunk import ChunkConfig, ChunkManager, check_disk_dir
from colossal_chunk.disk._store import DiskStore
from colossal_contracts import ConfigError, TierName


def test_write_behind_then_read_ahead_keeps_every_byte(tmp_path):
    store = DiskStore(tmp_path / "d")
    src = torch.randn(300_000)
    t = store.allocate("c0", src.numel(), torch.float32)
    t.copy_(src)
    store.write_behind("c0", t)  # pages leave this process, the file goes to the device
    store.drain()
    assert torch.equal(t, src)  # the mapping reads the values back from the file
    on_disk = torch.from_file(str(store.directory / "c0.bin"), size=src.numel())
    assert torch.equal(on_disk, src)
    t.add_(1.0)  # written in place after a write-behind, then again
    store.write_behind("c0", t)
    store.read_ahead("c0")
    store.read_ahead("c0")  # already read since the last write: no second read
    store.drain()
    io = store.io_stats()
    assert torch.equal(t, src + 1.0)
    assert (io.bytes_written, io.bytes_read) == (2 * src.numel() * 4, src.numel() * 4)
    store.close()
    assert not (tmp_path / "d").exists()  # the store created it, so it removes it


def test_a_payload_only_read_is_let_go_without_a_write(tmp_path):
    # [Note: reads let go]: its pages leave memory and the page cache as after a write-behind,
    # and nothing counts as written
    store = DiskStore(tmp_path / "d")
    src = torch.randn(300_000)
    t = store.allocate("g0", src.numel(), torch.float32)
    t.copy_(src)
    p = store._files["g0"]
    vec = ctypes.create_string_buffer(-(-p.nbytes // mmap.PAGESIZE))

    def in_page_cache() -> int:
        assert store._libc.held_mincore(p.base, p.nbytes, vec) == 0
        return sum(b & 1 for b in vec.raw)

    store.write_behind("g0", t)
    store.drain()
    after_write = in_page_cache()
    store.read_ahead("g0")
    store.drain()
    written = store.io_stats().bytes_written
    assert in_page_cache() == len(vec.raw) and torch.equal(t, src)  # read: every page back
    store.let_go("g0", t)
    store.drain()
    assert in_page_cache() <= after_write < len(vec.raw)
    assert store.io_stats().bytes_written == written
    assert not store.is_read_ahead("g0")  # its pages must be read again
    assert torch.equal(t, src)  # read back from the file
    store.close()


def test_store_in_an_existing_directory_leaves_the_directory(tmp_path):
    store = DiskStore(tmp_path)
    store.write_behind("missing", torch.zeros(1))  # unknown keys are ignored
    store.allocate("a", 10, torch.float32)
    store.close()
    assert tmp_path.exists() and not list(tmp_path.iterdir())


def test_manager_spills_to_disk_and_counts_background_io(tmp_path):
    cfg = ChunkConfig(
        1024, accelerator_bytes=8192, host_bytes=4096, disk_dir=tmp_path / "d", device="cpu"
    )
    params = [(f"p{i}", torch.nn.Parameter(torch.randn(1024))) for i in range(4)]
    values = {n: p.detach().clone() for n, p in params}
    with ChunkManager(cfg) as mgr:
        mgr.register(params)
        on_disk = [c for c in mgr.chunks.values() if c.tier is TierName.DISK]
        assert len(on_disk) == 3  # one chunk on the host, the rest spilled
        mgr.shard_io.read_ahead(on_disk)
        for n, p in params:
            mgr.access([n])
            assert torch.equal(p.data, values[n])
            mgr.release([n])
        stats = mgr.books.stats()
        assert stats.disk_io is not None and stats.disk_io.bytes_written >= 3 * 4096
    assert not (tmp_path / "d").exists()


def test_missing_directory_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        check_disk_dir(tmp_path / "nope", None)


def test_a_file_is_not_a_disk_directory(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(ConfigError, match="not a directory"):
        check_disk_dir(tmp_path / "f", None)


def test_unwritable_directory_is_a_config_error(tmp_path, monkeypatch):
    import tempfile

    def refuse(**kwargs):  # what a read-only directory answers (root writes anyway)
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "TemporaryFile", refuse)
    with pytest.raises(ConfigError, match="not writable"):
        check_disk_dir(tmp_path, None)


def test_budget_beyond_free_space_and_full_filesystem(tmp_path, monkeypatch):
    free = check_disk_dir(tmp_path, 1 << 20)
    with pytest.raises(ConfigError, match="larger than the"):
        check_disk_dir(tmp_path, free * 2 + (1 << 40))
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage._replace(free=4096))
    with pytest.raises(ConfigError, match="full filesystem"):
        check_disk_dir(tmp_path, None)
    assert [p.name for p in tmp_path.iterdir()] == []  # the probe file is gone
