"""Chunk payloads kept in files on disk, memory-mapped so that they read back as CPU tensors.

[Note: disk payloads] Each payload is one file of exactly its bytes, preallocated
(``posix_fallocate``: a full filesystem fails the allocation with a ``CapacityError`` instead of a
SIGBUS at the first write through the mapping, and write-back allocates no blocks) and mapped with
``torch.from_file(shared=True)``: writes go to the file, reads page in on demand. A new payload is
written whole next (the move that created it), so its pages are mapped writable in one call
(``MADV_POPULATE_WRITE``) instead of one fault per page. Files live in one directory the user
picks (default: a fresh temporary directory); ``close()`` removes every file, and the directory
too when the store created it (also when the store is garbage-collected or the interpreter exits
without ``close``).

[Note: scratch payloads] Payloads are a spill space, never read after the process ends, so
writing one out needs its pages on the device, not a durable file: ``sync_file_range`` (write,
wait) instead of ``fdatasync``, which also commits the filesystem journal once per file (one
commit per payload, each a few MiB, was where the tier lost against one sequential file).

[Note: disk read-ahead and write-behind] Two background threads keep disk traffic off the
critical path. ``read_ahead(key)`` brings a payload into memory before it is used (the manager
issues it for chunks the plan says come next): ``MADV_POPULATE_READ`` over the payload's own
mapping (held while it runs) reads the file and maps its pages into the process in one call, so
the later access takes no page fault; without it (another kernel, the mapping gone) the file is
read sequentially into the page cache through one reused block buffer. ``write_behind(key,
tensor)`` is issued once a payload was written (moved to disk, or updated in place by the
optimizer): it unmaps the payload's pages from this process at once, on the caller's thread
(``madvise(MADV_DONTNEED)``: dirty data moves to the page cache, nothing is lost), so the
process's resident memory holds only the disk pages in use; then the writer thread writes the
file out ([Note: scratch payloads]) and, with ``drop_cache``, drops its pages from the page
cache. A job holds the tensor it works on, so the mapping stays alive; ``discard`` waits for a
key's jobs before removing its file. Written pages are page cache until written out, so a writer
waits once more than 32 MiB are behind (back-pressure): the page cache the disk tier dirties
stays bounded by that window.
Both threads count bytes and seconds (``io_stats``): the disk throughput the tier achieved.
Their seconds include taking the interpreter lock back after each call: with a main thread
busy in Python, the same read-aheads measured about half their rate beside an idle one, so
few, large payloads are read and written at rates closer to the device's.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import mmap
import os
import shutil
import sys
import tempfile
import threading
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from colossal_contracts import CapacityError, ConfigError

__all__ = ["DiskIOStats", "DiskStore", "check_disk_dir"]

_MADV_DONTNEED = 4
_MADV_POPULATE_READ = 22  # Linux >= 5.14
_MADV_POPULATE_WRITE = 23
_READ_BLOCK = 8 << 20  # bytes per pread of a read-ahead
_MIN_FREE = 1 << 20  # below this a filesystem counts as full
_MAX_BEHIND = 32 << 20  # bytes written but not yet written behind before a writer waits
_SYNC_OUT = 1 | 2 | 4  # sync_file_range: wait for earlier writeback, write, wait for it
_SYNC_START = 2  # sync_file_range: start writing dirty pages out, do not wait
_FADV_WILLNEED, _FADV_DONTNEED = 3, 4  # posix_fadvise advice (Linux)


@dataclass(frozen=True)
class DiskIOStats:
    """What the disk tier's background threads did.

    Attributes:
        bytes_read: bytes read ahead from payload files.
        read_s: seconds the reader thread spent reading.
        bytes_written: bytes written behind to the device ([Note: scratch payloads]).
        write_s: seconds the writer thread spent writing.
    """

    bytes_read: int = 0
    read_s: float = 0.0
    bytes_written: int = 0
    write_s: float = 0.0

    def __sub__(self, other: DiskIOStats) -> DiskIOStats:
        return DiskIOStats(
            self.bytes_read - other.bytes_read,
            self.read_s - other.read_s,
            self.bytes_written - other.bytes_written,
            self.write_s - other.write_s,
        )


@dataclass
class _Payload:
    path: Path
    fd: int  # kept open for read-ahead and write-out
    base: int  # address of the mapping (0 for an empty payload)
    nbytes: int
    jobs: list[Future[None]]
    mapping: weakref.ref[torch.Tensor] | None = None  # the tensor over ``base``, while alive
    started: bool = False  # its queued read or write is already in flight in the kernel


def check_disk_dir(directory: str | os.PathLike[str] | None, budget: int | None) -> int:
    """Check that the disk tier can use ``directory`` (None: the temporary directory) for
    ``budget`` bytes (None: no limit) before anything runs; returns its free bytes.

    ``ConfigError`` (one line, naming the fix) when it is missing, not a directory, unwritable,
    on a full filesystem, or has less free space than ``budget``. Writes only a probe file it
    removes again.
    """
    where = Path(tempfile.gettempdir() if directory is None else directory)
    if not where.exists():
        raise ConfigError(
            f"disk tier directory {str(where)!r} does not exist; create it or pass another "
            "--disk-dir (disk_dir)"
        )
    if not where.is_dir():
        raise ConfigError(f"disk tier directory {str(where)!r} is not a directory; pass a folder")
    try:
        with tempfile.TemporaryFile(dir=where, prefix=".colossal-probe-") as f:
            f.write(b"\0")
            f.flush()
    except OSError as exc:
        raise ConfigError(
            f"disk tier directory {str(where)!r} is not writable ({exc.strerror}); pass a "
            "directory you can write to as --disk-dir (disk_dir)"
        ) from exc
    free = shutil.disk_usage(where).free
    if free < _MIN_FREE:
        raise ConfigError(
            f"disk tier directory {str(where)!r} is on a full filesystem ({free:,} bytes free); "
            "free space there or pass another --disk-dir (disk_dir)"
        )
    if budget is not None and budget > free:
        raise ConfigError(
            f"disk budget of {budget:,} bytes is larger than the {free:,} bytes free under "
            f"{str(where)!r}; lower --disk-budget (disk_budget) to at most {free:,} or free space"
        )
    return free


def _preallocate(fd: int, nbytes: int, path: Path) -> None:
    """Reserve the payload's blocks now: a full filesystem is an error here, not a SIGBUS when
    a page of the mapping is first written, and write-back allocates nothing."""
    if not hasattr(os, "posix_fallocate"):
        return
    try:
        os.posix_fallocate(fd, 0, nbytes)
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL):  # filesystems without fallocate
            return
        os.close(fd)
        path.unlink(missing_ok=True)
        raise CapacityError(
            f"disk tier cannot allocate {nbytes:,} bytes in {str(path.parent)!r} "
            f"({exc.strerror}); free space there or lower disk_bytes"
        ) from exc


@dataclass(frozen=True)
class _Libc:
    """The C library calls the store makes, twice: ``wait_*`` release the interpreter lock
    around the call (they block on the device), ``start_*`` keep it (they only queue I/O in the
    kernel or drop clean pages, and returning from them must not wait for the lock:
    [Note: disk read-ahead and write-behind])."""

    wait_madvise: ctypes._CFuncPtr
    wait_sync_range: ctypes._CFuncPtr
    start_sync_range: ctypes._CFuncPtr
    start_fadvise: ctypes._CFuncPtr

    @staticmethod
    def load() -> _Libc | None:
        """Linux's libc (``madvise``, ``sync_file_range``, ``posix_fadvise``), or None."""
        if not sys.platform.startswith("linux"):
            return None
        name = ctypes.util.find_library("c")
        fns = []
        for lib, fn, args in (
            (ctypes.CDLL, "madvise", [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]),
            (ctypes.CDLL, "sync_file_range", [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]),
            (ctypes.PyDLL, "sync_file_range", [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]),
            (ctypes.PyDLL, "posix_fadvise", [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_int]),
        ):  # fmt: skip
            f = getattr(lib(name, use_errno=True), fn)
            f.argtypes = args
            fns.append(f)
        return _Libc(*fns)


class DiskStore:
    """Memory-mapped files, one per payload key, in ``directory``; see [Note: disk payloads].

    Invariant: ``key in self`` exactly while a file for ``key`` exists.
    """

    _dir: Path
    _owns_dir: bool  # True when we created the directory and must remove it on close
    _files: dict[str, _Payload]

    def __init__(self, directory: str | os.PathLike[str] | None = None, *, drop_cache: bool = True):
        if directory is None:
            self._dir = Path(tempfile.mkdtemp(prefix="colossal-chunks-"))
            self._owns_dir = True
        else:
            self._dir = Path(directory)
            self._owns_dir = not self._dir.exists()
            try:
                self._dir.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ConfigError(
                    f"disk tier directory {str(self._dir)!r} cannot be created ({exc}); "
                    "pass a writable directory as disk_dir, or None for a temporary one"
                ) from exc
        self._files = {}
        self._remove = weakref.finalize(self, _remove_all, self._files, self._dir, self._owns_dir)
        self._drop_cache = drop_cache
        self._warm: set[str] = set()  # keys read ahead since they were last written
        self._lock = threading.Lock()
        self._counts = [0, 0.0, 0, 0.0]  # bytes read, read s, bytes written, write s
        self._reader: ThreadPoolExecutor | None = None
        self._read_buf: mmap.mmap | None = None  # the reader thread's block buffer
        self._behind: list[tuple[Future[None], int]] = []  # write-behinds in flight, oldest first
        self._writer: ThreadPoolExecutor | None = None
        self._queued: dict[str, list[_Payload]] = {"read": [], "write": []}  # not yet started
        self._libc = _Libc.load()
        self._madvise = None if self._libc is None else self._libc.wait_madvise

    @property
    def directory(self) -> Path:
        return self._dir

    def __contains__(self, key: str) -> bool:
        return key in self._files

    def allocate(self, key: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A 1-D tensor of ``numel`` elements backed by a new file; its content is zeros."""
        self.discard(key)
        path = self._dir / f"{key}.bin"
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        os.ftruncate(fd, max(nbytes, 1))
        if numel == 0:
            self._files[key] = _Payload(path, fd, 0, 0, [])
            return torch.empty(0, dtype=dtype)
        _preallocate(fd, nbytes, path)
        t = torch.from_file(str(path), shared=True, size=numel, dtype=dtype)
        base = t.untyped_storage().data_ptr()
        if self._madvise is not None and base % mmap.PAGESIZE == 0:
            # the caller writes the whole payload next: map every page writable in one call
            # instead of one fault per page (a no-op where the kernel lacks it)
            self._madvise(base, nbytes, _MADV_POPULATE_WRITE)  # type: ignore[operator]
        self._files[key] = _Payload(path, fd, base, nbytes, [], weakref.ref(t))
        return t

    # ----- background I/O ([Note: disk read-ahead and write-behind]) ----------------------------
    def read_ahead(self, key: str) -> None:
        """Start reading ``key``'s file into the page cache (no-op if read since last written)."""
        p = self._files.get(key)
        if p is None or p.nbytes == 0 or key in self._warm:
            return
        self._warm.add(key)
        if self._reader is None:
            self._reader = ThreadPoolExecutor(1, "colossal-disk-read")
        self._queue("read", p)
        self._track(p, self._reader.submit(self._read, p))

    def write_behind(self, key: str, tensor: torch.Tensor) -> None:
        """Start writing ``key``'s payload (``tensor``, its mapping) to the device and dropping
        its pages from this process's memory."""
        p = self._files.get(key)
        if p is None or p.nbytes == 0:
            return
        if key in self._warm:  # a read-ahead not done yet would map the pages again after
            self._warm.discard(key)  # the unmap below: cancel it if queued, else wait for it
            jobs, p.jobs = p.jobs, []
            for j in jobs:
                if not j.cancel():
                    j.result()
        mine = tensor.untyped_storage().data_ptr() == p.base  # the mapping of this payload
        if self._madvise is not None and mine and p.base % mmap.PAGESIZE == 0:
            # unmapped from this process now (cheap), so its resident memory never holds more
            # of the disk tier than the payloads in use; the page cache keeps the dirty data
            self._madvise(p.base, p.nbytes, _MADV_DONTNEED)  # type: ignore[operator]
        if self._writer is None:
            self._writer = ThreadPoolExecutor(1, "colossal-disk-write")
        self._queue("write", p)
        job = self._writer.submit(self._write, p, tensor)
        self._track(p, job)
        self._behind.append((job, p.nbytes))
        # back-pressure: dirty pages are host memory until written out, so bound them
        while sum(n for _, n in self._behind) > _MAX_BEHIND and len(self._behind) > 1:
            self._behind.pop(0)[0].result()
        self._behind = [(j, n) for j, n in self._behind if not j.done()]

    def drain(self) -> None:
        """Wait until every read-ahead and write-behind issued so far is done."""
        for p in list(self._files.values()):
            self._wait(p)

    def io_stats(self) -> DiskIOStats:
        """Bytes and seconds of background I/O since the store was created."""
        with self._lock:
            r, rs, w, ws = self._counts
        return DiskIOStats(int(r), float(rs), int(w), float(ws))

    def _track(self, p: _Payload, job: Future[None]) -> None:
        p.jobs = [j for j in p.jobs if not j.done()]
        p.jobs.append(job)

    def _wait(self, p: _Payload) -> None:
        jobs, p.jobs = p.jobs, []
        for j in jobs:
            j.result()

    def _queue(self, kind: str, p: _Payload) -> None:
        with self._lock:
            p.started = False
            self._queued[kind].append(p)

    def _start_queued(self, kind: str) -> None:
        """Queue the device I/O of every payload waiting for this thread in the kernel now
        (read: ``POSIX_FADV_WILLNEED``; write: ``SYNC_FILE_RANGE_WRITE``), without giving up
        the interpreter lock; each job then only waits for its own."""
        with self._lock:
            todo, self._queued[kind] = self._queued[kind], []
        if self._libc is None:
            return
        for q in todo:
            if q.started or q.nbytes == 0:
                continue
            q.started = True
            with contextlib.suppress(OSError):  # the file was discarded meanwhile
                if kind == "read":
                    self._libc.start_fadvise(q.fd, 0, q.nbytes, _FADV_WILLNEED)
                else:
                    self._libc.start_sync_range(q.fd, 0, q.nbytes, _SYNC_START)

    def _read(self, p: _Payload) -> None:
        t0 = time.perf_counter()
        self._start_queued("read")
        t = p.mapping() if p.mapping is not None else None  # held: the mapping stays alive
        if (
            t is not None
            and self._madvise is not None
            and p.base % mmap.PAGESIZE == 0
            and t.untyped_storage().data_ptr() == p.base
            and self._madvise(p.base, p.nbytes, _MADV_POPULATE_READ) == 0  # type: ignore[operator]
        ):  # read into the page cache and mapped here: the access takes no page faults
            self._add(0, p.nbytes, time.perf_counter() - t0)
            return
        if self._read_buf is None:  # one buffer, reused: only the pages a read touched are resident
            self._read_buf = mmap.mmap(-1, _READ_BLOCK, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        buf = memoryview(self._read_buf)[: min(_READ_BLOCK, p.nbytes)]
        done = 0
        while done < p.nbytes:
            n = os.preadv(p.fd, [buf[: min(len(buf), p.nbytes - done)]], done)
            if n <= 0:
                break
            done += n
        self._add(0, done, time.perf_counter() - t0)

    def _write(self, p: _Payload, tensor: torch.Tensor) -> None:
        t0 = time.perf_counter()
        self._start_queued("write")
        # [Note: scratch payloads]: written out, not made durable (no journal commit per file)
        lc = self._libc
        if lc is None or lc.wait_sync_range(p.fd, 0, p.nbytes, _SYNC_OUT) != 0:
            os.fdatasync(p.fd)
        if self._drop_cache:  # clean pages now: dropping them does not block
            if lc is not None:
                lc.start_fadvise(p.fd, 0, 0, _FADV_DONTNEED)
            elif hasattr(os, "posix_fadvise"):
                os.posix_fadvise(p.fd, 0, 0, os.POSIX_FADV_DONTNEED)
        self._add(2, p.nbytes, time.perf_counter() - t0)

    def _add(self, at: int, nbytes: int, seconds: float) -> None:
        with self._lock:
            self._counts[at] += nbytes
            self._counts[at + 1] += seconds

    # ----- lifetime -----------------------------------------------------------------------------
    def discard(self, key: str) -> None:
        """Remove the file of ``key`` (tensors still mapping it stay readable until dropped)."""
        p = self._files.pop(key, None)
        if p is not None:
            self._wait(p)
            self._warm.discard(key)
            os.close(p.fd)
            p.path.unlink(missing_ok=True)

    def close(self) -> None:
        """Remove every file, and the directory when this store created it."""
        for key in list(self._files):
            self.discard(key)
        for pool in (self._reader, self._writer):
            if pool is not None:
                pool.shutdown(wait=True)
        self._reader = self._writer = None
        self._remove()


def _remove_all(files: dict[str, _Payload], directory: Path, owns_dir: bool) -> None:
    for p in files.values():
        with contextlib.suppress(OSError):
            os.close(p.fd)
        p.path.unlink(missing_ok=True)
    files.clear()
    if owns_dir:
        shutil.rmtree(directory, ignore_errors=True)
