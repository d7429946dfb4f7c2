"""Disk payload files ([Note: disk payloads], [Note: disk read-ahead and write-behind]): blocks
are reserved when a payload is created (no space is a CapacityError, not a SIGBUS later), a
write-behind takes the pages out of this process and a read-ahead maps them back in before use."""

import errno
import os
import sys

import psutil
import pytest
import torch

from colossal_chunk import DiskStore
from colossal_contracts import CapacityError

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux madvise")
NUMEL = 1 << 20  # 4 MiB of fp32


def _resident(path) -> int:  # type: ignore[no-untyped-def]
    """Bytes of ``path``'s mapping resident in this process."""
    return sum(m.rss for m in psutil.Process().memory_maps(grouped=False) if m.path == str(path))


def test_payload_blocks_are_reserved_at_allocation(tmp_path):
    store = DiskStore(tmp_path)
    store.allocate("c0", NUMEL, torch.float32)
    st = os.stat(tmp_path / "c0.bin")
    assert st.st_size == NUMEL * 4
    if hasattr(os, "posix_fallocate"):
        assert st.st_blocks * 512 >= NUMEL * 4  # not a sparse file
    store.close()


def test_no_space_is_a_capacity_error_and_leaves_no_file(tmp_path, monkeypatch):
    store = DiskStore(tmp_path)

    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", full, raising=False)
    with pytest.raises(CapacityError, match=r"cannot allocate .* lower disk_bytes"):
        store.allocate("c0", NUMEL, torch.float32)
    assert "c0" not in store and not (tmp_path / "c0.bin").exists()
    store.close()


@linux
def test_write_behind_unmaps_and_read_ahead_maps_the_payload_back(tmp_path):
    store = DiskStore(tmp_path)
    src = torch.randn(NUMEL)
    t = store.allocate("c0", NUMEL, torch.float32)
    t.copy_(src)
    path = tmp_path / "c0.bin"
    assert _resident(path) == NUMEL * 4
    store.write_behind("c0", t)
    store.drain()
    assert _resident(path) == 0  # out of the process (and of the page cache)
    store.read_ahead("c0")
    store.drain()
    assert _resident(path) == NUMEL * 4  # mapped in ahead of use: the access faults on nothing
    assert torch.equal(t, src)
    assert store.io_stats().bytes_read == NUMEL * 4
    store.close()


def test_read_ahead_without_the_mapping_still_reads_the_file(tmp_path):
    store = DiskStore(tmp_path)
    t = store.allocate("c0", NUMEL, torch.float32)
    t.fill_(3.0)
    store.write_behind("c0", t)
    store.drain()
    del t  # the payload's tensor is gone: the reader falls back to reading the file
    store.read_ahead("c0")
    store.drain()
    assert store.io_stats().bytes_read == NUMEL * 4
    back = torch.from_file(str(tmp_path / "c0.bin"), size=NUMEL)
    assert torch.equal(back, torch.full((NUMEL,), 3.0))
    store.close()
