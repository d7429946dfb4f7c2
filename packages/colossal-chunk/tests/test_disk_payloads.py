"""Disk payload files ([Note: disk payloads], [Note: disk read-ahead and write-behind]): blocks
are reserved when a payload is created (no space is a CapacityError, not a SIGBUS later), a
write-behind takes the pages out of this process and a read-ahead maps them back in before use."""

import errno
import os
import sys
import time

import psutil
import pytest
import torch

from colossal_chunk.disk._store import DiskStore
from colossal_contracts import CapacityError

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux madvise")
NUMEL = 1 << 20  # 4 MiB of fp32


def _resident(path) -> int:  # type: ignore[no-untyped-def]
    """Bytes of ``path``'s mapping resident in this process."""
    return sum(m.rss for m in psutil.Process().memory_maps(grouped=False) if m.path == str(path))


def _written_out(store: DiskStore, keys: list[str], numel: int) -> list[torch.Tensor]:
    """A payload of ``numel`` fp32 per key, the i-th filled with i + 1, each written behind and
    drained (out of this process's memory)."""
    ts = [store.allocate(k, numel, torch.float32) for k in keys]
    for i, (k, t) in enumerate(zip(keys, ts, strict=True)):
        t.fill_(float(i + 1))
        store.write_behind(k, t)
    store.drain()
    return ts


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
    del _written_out(store, ["c0"], NUMEL)[0]  # the payload's tensor is gone: the reader
    # falls back to reading the file
    store.read_ahead("c0")
    store.drain()
    assert store.io_stats().bytes_read == NUMEL * 4
    back = torch.from_file(str(tmp_path / "c0.bin"), size=NUMEL)
    assert torch.equal(back, torch.ones(NUMEL))
    store.close()


def test_payloads_of_one_kind_share_a_file_in_slots_reused_as_zeros(tmp_path):
    store = DiskStore(tmp_path)
    a = store.allocate("exp_avg-0@disk", 1000, torch.float32)  # 4,000 bytes: one page
    b = store.allocate("exp_avg-1@disk", 1000, torch.float32)
    store.allocate("param-0@disk", 10, torch.float32)
    a.fill_(1.0)
    b.fill_(2.0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exp_avg.bin", "param.bin"]
    on_disk = torch.from_file(str(tmp_path / "exp_avg.bin"), size=2048)  # two page slots
    assert on_disk[:1000].eq(1.0).all() and on_disk[1024:2024].eq(2.0).all()
    store.discard("exp_avg-0@disk")
    c = store.allocate("exp_avg-2@disk", 1000, torch.float32)  # `a` still maps slot 0
    assert a.eq(1.0).all() and c.eq(0.0).all()  # a new slot: the old tensor keeps its bytes
    del a
    store.discard("exp_avg-1@disk")
    del b
    again = store.allocate("exp_avg-1@disk", 1000, torch.float32)  # its own slot back, zeroed
    assert again.eq(0.0).all()
    again.fill_(5.0)
    on_disk = torch.from_file(str(tmp_path / "exp_avg.bin"), size=3072)
    assert on_disk[1024:2024].eq(5.0).all() and on_disk.numel() == 3 * 1024  # no fourth slot
    store.close()
    assert not list(tmp_path.iterdir())


def test_io_seconds_count_while_io_is_in_flight(tmp_path):
    store = DiskStore(tmp_path)
    ts = _written_out(store, [f"g-{i}" for i in range(4)], NUMEL // 4)
    for i in range(4):
        store.read_ahead(f"g-{i}")
    store.drain()
    io = store.io_stats()
    assert (io.bytes_written, io.bytes_read) == (NUMEL * 4, NUMEL * 4)
    assert io.write_s > 0 and io.read_s > 0
    assert store.io_stats() == io  # nothing in flight: the seconds stand still
    assert [t[0].item() for t in ts] == [1.0, 2.0, 3.0, 4.0]
    store.close()


def test_queued_write_behinds_go_out_together_and_cancelled_jobs_end(tmp_path):
    store = DiskStore(tmp_path)
    ts = [store.allocate(f"m-{i}", NUMEL // 8, torch.float32) for i in range(8)]
    for i, t in enumerate(ts):
        t.fill_(float(i))
        store.read_ahead(f"m-{i}")  # written next: a queued read-ahead is cancelled
        store.write_behind(f"m-{i}", t)
    store.drain()
    io = store.io_stats()
    assert io.bytes_written == 8 * NUMEL // 2
    time.sleep(0.01)
    assert store.io_stats() == io  # every read and write ended, cancelled ones too
    back = torch.from_file(str(tmp_path / "m.bin"), size=NUMEL)  # eight consecutive slots
    assert torch.equal(back, torch.arange(8.0).repeat_interleave(NUMEL // 8))
    store.close()


def _read_back(store, path, waits) -> list:  # type: ignore[no-untyped-def]
    """Write three payloads behind, read them ahead; ``waits`` gets the reader's calls that
    release the interpreter lock to wait for the device. Returns the reads' records."""
    import dataclasses

    ts = _written_out(store, [f"r-{i}" for i in range(3)], NUMEL // 4)
    assert _resident(path) == 0  # unmapped from this process
    lc = store._libc
    wait = lc.wait_madvise
    store._libc = dataclasses.replace(lc, wait_madvise=lambda *a: waits.append(a[2]) or wait(*a))
    store.record_reads()  # recording from here
    for i in range(3):
        store.read_ahead(f"r-{i}")
    store.drain()
    records = store.record_reads()
    assert [r.nbytes for r in records] == [NUMEL] * 3
    assert all(r.issued <= r.started <= r.ended for r in records)
    assert _resident(path) == NUMEL * 3  # mapped in ahead of use
    assert [t[-1].item() for t in ts] == [1.0, 2.0, 3.0]
    assert store.io_stats().bytes_read == 3 * NUMEL
    store.close()
    return records


@linux
def test_a_read_ahead_already_in_the_page_cache_maps_without_waiting_for_the_device(tmp_path):
    waits: list[int] = []
    kept = DiskStore(tmp_path / "kept", drop_cache=False)
    assert all(r.cached for r in _read_back(kept, tmp_path / "kept" / "r.bin", waits))
    assert waits == []  # the written pages stayed in the page cache: mapped keeping the lock
    _read_back(DiskStore(tmp_path / "dropped"), tmp_path / "dropped" / "r.bin", waits)
    assert len(waits) <= 3  # dropped from the cache: the reader reads each one, and
    # a payload not in yet when the reader gets to it is waited for with the lock released


@linux
def test_a_payload_used_before_the_reader_took_up_its_read_ahead_is_mapped_by_its_user(tmp_path):
    import threading

    store = DiskStore(tmp_path)
    [t] = _written_out(store, ["u-0"], NUMEL)
    store.record_reads()
    busy = threading.Event()
    store.read_ahead("u-0")  # starts the reader thread; then keep it busy
    store._io.reader.submit(busy.wait)  # type: ignore[union-attr]
    store.read_ahead("u-0")  # no-op: read since last written
    store.write_behind("u-0", t)  # drops or waits for the first read-ahead
    store.read_ahead("u-0")  # queued behind the busy job: the reader cannot take it up
    user = threading.Thread(target=store.finish_read, args=("u-0",))
    user.start()
    user.join(timeout=60)
    try:
        assert not user.is_alive()  # mapped by the user, not waiting for the reader
        [*_, r] = store.record_reads()
        assert r.nbytes == NUMEL * 4 and store.io_stats().bytes_read >= NUMEL * 4
        assert _resident(tmp_path / "u.bin") == NUMEL * 4
    finally:
        busy.set()
    store.finish_read("u-0")  # nothing in flight: a no-op
    assert t[-1].item() == 1.0
    store.close()


def test_a_write_out_waits_for_the_reads_in_flight(tmp_path, monkeypatch):
    from colossal_chunk.disk import _io as _disk

    monkeypatch.setattr(_disk, "_READS_FIRST_S", 60.0)  # [Note: reads first], no time limit
    store = DiskStore(tmp_path)
    t = store.allocate("w-0", NUMEL, torch.float32)
    t.fill_(1.0)
    reads = store._io.in_flight[0]
    reads.start()  # a read in flight
    store.write_behind("w-0", t)
    time.sleep(0.2)
    assert store.io_stats().bytes_written == 0  # held back while the read is in flight
    reads.end(0)
    store.drain()
    assert store.io_stats().bytes_written == NUMEL * 4
    assert reads.wait_idle(0.0)  # none in flight: at once
    reads.start()
    assert not reads.wait_idle(0.01)  # still in flight: timed out
    reads.end(0)
    assert reads.wait_idle(0.0)
    store.close()
