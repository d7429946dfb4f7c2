"""The disk baselines of ``bench_capacity_disk``, run in the same directory as the tier: a plain
file written and read sequentially (fresh, or aged by bytes written since) and the disk tier's
store alone, each in MiB/s."""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch

from colossal_chunk.disk._store import DiskStore

MiB = 2**20
_BLOCK = 8 * MiB


def _write_file(path: Path, nbytes: int) -> float:
    """MiB/s of writing one plain file of ``nbytes`` (8 MiB writes, then fdatasync); its pages
    are dropped from the cache afterwards."""
    block = os.urandom(_BLOCK)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        t0, done = time.perf_counter(), 0
        while done < nbytes:
            done += os.write(fd, block[: min(_BLOCK, nbytes - done)])
        os.fdatasync(fd)
        write_s = time.perf_counter() - t0
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return nbytes / write_s / MiB


def _read_file(path: Path, nbytes: int) -> float:
    """MiB/s of reading the first ``nbytes`` of ``path`` with 8 MiB preads, none of it in the
    page cache (posix_fadvise DONTNEED first)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        buf = memoryview(bytearray(_BLOCK))
        t0, got = time.perf_counter(), 0
        while got < nbytes:
            n = os.preadv(fd, [buf], got)
            if n <= 0:
                break
            got += n
        read_s = time.perf_counter() - t0
    finally:
        os.close(fd)
    return got / read_s / MiB


def _sequential(where: Path, nbytes: int) -> tuple[float, float]:
    """(write MiB/s, read MiB/s) of one plain file of ``nbytes``: 8 MiB writes, fdatasync, the
    pages dropped from the cache, then 8 MiB preads: the same path the tier's files take."""
    path = where / "sequential.bin"
    try:
        return _write_file(path, nbytes), _read_file(path, nbytes)
    finally:
        path.unlink(missing_ok=True)


def _sequential_aged(where: Path, nbytes: int, gap: int) -> float:
    """Read MiB/s of one plain file of ``nbytes`` written as the tier's payloads are before
    their reads: written (8 MiB writes, fdatasync, pages dropped), then ``gap`` bytes written to
    another file the same way, then read with 8 MiB preads, none of it in the guest's page
    cache: the device's rate for data as old, in bytes written since, as a payload's."""
    path, other = where / "aged.bin", where / "written-between.bin"
    try:
        _write_file(path, nbytes)
        _write_file(other, gap)
        other.unlink()
        return _read_file(path, nbytes)
    finally:
        path.unlink(missing_ok=True)
        other.unlink(missing_ok=True)


def _store_alone(where: Path, nbytes: int, payload: int) -> tuple[float, float]:
    """(write MiB/s, read MiB/s) of the disk tier's store alone, nothing else running in the
    process: ``nbytes`` in payloads of ``payload`` bytes put (from host tensors) and written
    behind, then read ahead four at a time, as the manager does; its own counters."""
    store = DiskStore(where / "store-alone")
    try:
        n, numel = max(1, nbytes // payload), payload // 4
        ts = []
        for i in range(n):
            t = store.put(f"alone-{i}", torch.full((numel,), float(i)))
            store.write_behind(f"alone-{i}", t)
            ts.append(t)
        store.drain()
        for i in range(0, n, 4):
            for j in range(i, min(n, i + 4)):
                store.read_ahead(f"alone-{j}")
            store.drain()
        io = store.io_stats()
        assert all(t[-1].item() == float(i) for i, t in enumerate(ts))
    finally:
        store.close()
    return io.bytes_written / io.write_s / MiB, io.bytes_read / io.read_s / MiB
