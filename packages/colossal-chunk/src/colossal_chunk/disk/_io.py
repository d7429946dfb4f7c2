"""The disk store's background I/O: reader threads that map read-aheads, a writer thread that
writes payloads out and drops them from the page cache. Measurements behind each choice below
are in docs/gemini.md ("The disk store's notes, measured").

[Note: disk read-ahead and write-behind] Background threads keep disk traffic off the critical
path: two readers ([Note: two readers]) and a writer. ``read_ahead(key)`` brings a payload into
memory before it is used: ``MADV_POPULATE_READ`` over the payload's own mapping (held while it
runs) reads the file and maps its pages in one call, so the later access takes no page fault;
without it (another kernel, the mapping gone) the file is read sequentially into the page cache
through one reused block buffer. A reader job maps every read-ahead queued while it runs,
soonest first, one at a time (one wake-up, few interpreter-lock hand-overs); a payload whose
pages are all in the page cache (``mincore``) is mapped keeping the lock, only one still being
read is waited for with the lock released. A payload about to be used whose read-ahead no reader
has taken up yet is mapped by its user (``finish_read``). A write-behind or ``discard`` drops a
read-ahead not taken up yet and waits for one being mapped, so no read maps pages again after
their unmap ([Note: read-ahead window] in ``disk/_read_ahead.py``). ``write_behind`` unmaps the
payload's pages on the caller's thread (``MADV_DONTNEED``: dirty data moves to the page cache),
then the writer writes out every write-behind queued when it runs, each run of consecutive slots
in pieces ([Note: reads first]), and drops it from the page cache ([Note: dropped whole]). A
write job holds its tensor and a read its mapping, so the mapping stays alive. A writer waits once
more than ``behind_limit`` bytes are behind (back-pressure): the page cache the tier dirties stays
bounded ([Note: deeper writes while no read waits]). The caller does not start a write itself
(that left pages cached after the writer's drop).

[Note: deeper writes while no read waits] While a read-ahead is queued or in flight, write-behinds
wait once ``_MAX_BEHIND`` bytes are behind, so a read never finds the device behind a long
queue; while none is, the queue deepens to ``_MAX_BEHIND_IDLE``, so a burst of write-behinds (an
optimizer update set, a chunk evicted per moment) does not hold up the training thread while the
device has nothing else to do. ``_MAX_BEHIND_IDLE`` is the bound on the host memory dirty pages
take, whatever the reads.

[Note: reads first] A read is on the step's path, a write-behind is not, and the device serves
both at once more slowly than either alone: a write-out starts once no read-ahead is in flight,
or after waiting ``_READS_FIRST_S``; it is given to the device ``_WRITE_PIECE`` bytes at a time,
each piece waiting for the reads first, so a read waits behind at most one piece.

[Note: whole payloads while reads are idle] While no read is in flight a write-out goes out in
pieces of ``_WRITE_PIECE_IDLE`` (a payload's size): 1 MiB pieces with nothing else queued left the
device idle while the writer paid each piece's submission and completion.

[Note: no read queued at issue] The caller does not queue a read-ahead in the kernel
(``POSIX_FADV_WILLNEED``): that filled the page cache a small page at a time on the training
thread; the reader's populate reads through the page-fault path in larger requests.

[Note: two readers] Two reader threads map read-aheads, so two are in flight on the device at
once and a read that waits behind a write piece does not hold up every read queued after it.

[Note: dropped whole] Pages written with ``pwrite`` sit in the page cache as large folios, and
``POSIX_FADV_DONTNEED`` over a range drops no folio that straddles its ends: each run of slots
written out is dropped once more whole, after its last piece (``tests/test_disk_put.py``).
"""

from __future__ import annotations

import ctypes
import mmap
import os
import threading
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch

from ._files import Slot, SlotFile
from ._libc import FADV_DONTNEED, MADV_POPULATE_READ, SYNC_OUT, Libc
from ._stats import DiskIOStats, InFlight, ReadRecord

__all__ = ["DiskIO", "Payload"]

_READ_BLOCK = 8 << 20  # bytes per pread of a read-ahead
_READERS = 2  # reader threads: read-aheads in flight on the device at once ([Note: two readers])
_MAX_BEHIND = 32 << 20  # bytes behind before a writer waits while a read waits
_MAX_BEHIND_IDLE = 96 << 20  # the same while none does: the bound on dirty host memory
_READS_FIRST_S = 0.02  # longest a write-out waits for the reads in flight ([Note: reads first])
_WRITE_PIECE = 1 << 20  # bytes a write-out gives the device at once ([Note: reads first])
_WRITE_PIECE_IDLE = 4 << 20  # the same while no read is in flight ([Note: whole payloads ...])


@dataclass
class Payload:
    file: SlotFile | None  # where it lives ([Note: disk payload layout]); None when empty
    slot: Slot | None
    fd: int  # the file's, open for read-ahead and write-out
    offset: int  # of its bytes in the file
    base: int  # address of the mapping (0 for an empty payload)
    nbytes: int
    jobs: list[Future[None]]  # its write-behinds in flight
    mapping: weakref.ref[mmap.mmap] | None = None  # the mapping at ``base``, while alive
    read: threading.Event | None = None  # set once its last read-ahead is done (or dropped)
    issued: float = 0.0  # when its last read-ahead was issued
    put_open: bool = False  # put: its write is in flight, ``write_behind`` not issued yet


@dataclass(eq=False)
class _Write:
    p: Payload
    tensor: torch.Tensor  # held: the mapping stays alive until it is written out


class DiskIO:
    """The reader and writer threads of one ``DiskStore`` and what they have in flight
    ([Note: disk read-ahead and write-behind]); the store owns the payloads."""

    in_flight: tuple[InFlight, InFlight]  # reads, writes ([Note: in-flight time])

    def __init__(self, libc: Libc | None, *, drop_cache: bool):
        self._libc = libc
        self._drop_cache = drop_cache
        self._lock = threading.Lock()
        self._busy = InFlight()  # either kind ([Note: busy time])
        self.in_flight = (InFlight(self._busy), InFlight(self._busy))
        self.reader: ThreadPoolExecutor | None = None
        self._reads: list[Payload] = []  # read-aheads issued, not yet taken by a reader
        self._records: list[ReadRecord] | None = None  # reads done, while recording
        # the readers' block buffer: shared, what is read into it is never used
        self._read_buf: mmap.mmap | None = None
        self._behind: list[tuple[Future[None], int]] = []  # write-behinds in flight, oldest first
        self._writer: ThreadPoolExecutor | None = None
        self._writes: list[_Write] = []  # write-behinds not yet taken by the writer

    def read_ahead(self, p: Payload) -> None:
        """Queue ``p``'s read-ahead for the readers."""
        if self.reader is None:
            self.reader = ThreadPoolExecutor(_READERS, "colossal-disk-read")
        self.in_flight[0].start()  # the reader's populate reads ([Note: no read queued at issue])
        p.read, p.issued = threading.Event(), time.perf_counter()
        with self._lock:
            self._reads.append(p)
        self.reader.submit(self._read)

    def write_behind(self, p: Payload, tensor: torch.Tensor) -> None:
        """Queue ``p`` (``tensor``, its mapping, already unmapped) for the writer; waits while
        more than ``behind_limit`` bytes are behind."""
        if self._writer is None:
            self._writer = ThreadPoolExecutor(1, "colossal-disk-write")
        if not p.put_open:  # else in flight since its put
            self.in_flight[1].start()
        p.put_open = False
        w = _Write(p, tensor)
        with self._lock:
            self._writes.append(w)
        job = self._writer.submit(self._write)
        p.jobs = [j for j in p.jobs if not j.done()]
        p.jobs.append(job)
        self._behind.append((job, p.nbytes))
        # back-pressure: dirty pages are host memory until written out, so bound them
        while sum(n for _, n in self._behind) > self.behind_limit and len(self._behind) > 1:
            self._behind.pop(0)[0].result()
        self._behind = [(j, n) for j, n in self._behind if not j.done()]

    @property
    def behind_limit(self) -> int:
        """Bytes behind at which a write-behind waits: ``_MAX_BEHIND`` while a read-ahead is
        queued or in flight, else ``_MAX_BEHIND_IDLE`` ([Note: deeper writes while no read
        waits])."""
        return _MAX_BEHIND if self._reads or self.in_flight[0].open else _MAX_BEHIND_IDLE

    def wait(self, p: Payload, *, drop_read: bool = False) -> None:
        """Wait for ``p``'s read-ahead (with ``drop_read``, one not taken by a reader yet is
        dropped instead: it reads nothing) and its write-behinds."""
        if drop_read and self._unqueue(p):
            self.in_flight[0].end(0)
            if p.read is not None:  # (a queued read-ahead has its event)
                p.read.set()
        if p.read is not None:
            p.read.wait()
        jobs, p.jobs = p.jobs, []
        for j in jobs:
            j.result()

    def finish_read(self, p: Payload) -> None:
        """Map ``p`` on this thread if no reader took its read-ahead up yet, else wait for it."""
        if p.read is None or p.read.is_set():
            return
        if self._unqueue(p):
            self._map(p)
        else:
            p.read.wait()

    def stats(self) -> DiskIOStats:
        """Bytes and seconds of background I/O so far ([Note: in-flight time], [Note: busy
        time])."""
        (r, rs), (w, ws) = (c.totals() for c in self.in_flight)
        return DiskIOStats(r, rs, w, ws, self._busy.totals()[1])

    def record_reads(self) -> list[ReadRecord]:
        """The read-aheads done since the last call (recording starts at the first call)."""
        with self._lock:
            got, self._records = self._records or [], []
        return got

    def close(self) -> None:
        """Wait for the threads' jobs and stop them."""
        for pool in (self.reader, self._writer):
            if pool is not None:
                pool.shutdown(wait=True)
        self.reader = self._writer = None

    # ----- the readers ----------------------------------------------------------------------
    def _unqueue(self, p: Payload) -> bool:
        """Take ``p``'s read-ahead off the readers' queue; whether it was there (not started)."""
        with self._lock:
            queued = any(q is p for q in self._reads)
            self._reads = [q for q in self._reads if q is not p]
        return queued

    def _read(self) -> None:
        """Map the read-aheads queued, soonest first, one at a time on each reader thread ([Note:
        two readers]; a caller about to use one not taken up yet maps it itself:
        ``finish_read``)."""
        while True:
            with self._lock:
                if not self._reads:
                    return
                p = self._reads.pop(0)
            self._map(p)

    def _map(self, p: Payload) -> None:
        """Do ``p``'s read-ahead on this thread; it is over when this returns (or raises:
        then it read nothing)."""
        started, n, cached = time.perf_counter(), 0, False
        try:
            n, cached = self._read_into(p)
        finally:
            self.in_flight[0].end(n)
            if p.read is not None:  # (a read-ahead has its event)
                p.read.set()
        r = ReadRecord(p.issued, started, time.perf_counter(), n, cached)
        with self._lock:
            if self._records is not None:
                self._records.append(r)

    def _read_into(self, p: Payload) -> tuple[int, bool]:
        """Bring ``p``'s bytes into memory; returns how many were read, and whether they were
        all in the page cache already."""
        mm = p.mapping() if p.mapping is not None else None  # held: the mapping stays alive
        lc = self._libc
        if mm is not None and lc is not None and p.base % mmap.PAGESIZE == 0:
            # in the page cache already: map it keeping the interpreter lock (no device wait);
            # else wait for the device with the lock released. Either way the pages are read
            # into the page cache and mapped here: the access takes no page faults
            cached = self._cached(p)
            populate = lc.held_madvise if cached else lc.wait_madvise
            if populate(p.base, p.nbytes, MADV_POPULATE_READ) == 0:
                return p.nbytes, cached
        if self._read_buf is None:  # one buffer, reused: only the pages a read touched are resident
            self._read_buf = mmap.mmap(-1, _READ_BLOCK, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        buf = memoryview(self._read_buf)[: min(_READ_BLOCK, p.nbytes)]
        done = 0
        while done < p.nbytes:
            n = os.preadv(p.fd, [buf[: min(len(buf), p.nbytes - done)]], p.offset + done)
            if n <= 0:
                break
            done += n
        return done, False

    def _cached(self, p: Payload) -> bool:
        """Whether every page of ``p``'s mapping is in the page cache (``mincore``)."""
        pages = -(-p.nbytes // mmap.PAGESIZE)
        vec = ctypes.create_string_buffer(pages)
        if self._libc is None or self._libc.held_mincore(p.base, p.nbytes, vec) != 0:
            return False
        return vec.raw.count(0, 0, pages) == 0  # bit 0 of each page's byte: resident

    # ----- the writer -----------------------------------------------------------------------
    def _write(self) -> None:
        """Write out every write-behind queued so far (one job's own may already be out, with
        an earlier job's batch): the runs of consecutive slots, a piece at a time, each waiting
        for the reads in flight first ([Note: reads first]; ``_WRITE_PIECE_IDLE`` bytes when
        none is left, else ``_WRITE_PIECE``); the thread takes the interpreter lock back once
        per piece."""
        with self._lock:
            batch, self._writes = self._writes, []
        if not batch:
            return
        done = False
        try:
            runs = _runs([w.p for w in batch])
            for fd, offset, nbytes in runs:
                at = 0
                while at < nbytes:
                    idle = self.in_flight[0].wait_idle(_READS_FIRST_S)  # [Note: reads first]
                    # [Note: whole payloads while reads are idle]
                    n = min(_WRITE_PIECE_IDLE if idle else _WRITE_PIECE, nbytes - at)
                    self._write_out((fd, offset + at, n))
                    at += n
            for run in runs:  # [Note: dropped whole]
                self._drop(run)
            done = True
        finally:
            for w in batch:
                self.in_flight[1].end(w.p.nbytes if done else 0)

    def _write_out(self, piece: tuple[int, int, int]) -> None:
        """Write ``piece`` (fd, offset, bytes) out and wait for it; then drop it from the page
        cache ([Note: scratch payloads] in ``disk/_store.py``: written out, not made durable)."""
        if self._libc is None or self._libc.wait_sync_range(*piece, SYNC_OUT) != 0:
            os.fdatasync(piece[0])
        self._drop(piece)

    def _drop(self, piece: tuple[int, int, int]) -> None:
        """Drop the clean pages of ``piece`` (fd, offset, bytes) from the page cache (with
        ``drop_cache``); does not block."""
        if not self._drop_cache:
            return
        if self._libc is not None:
            self._libc.held_fadvise(*piece, FADV_DONTNEED)
        elif hasattr(os, "posix_fadvise"):
            os.posix_fadvise(*piece, os.POSIX_FADV_DONTNEED)


def _runs(payloads: list[Payload]) -> list[tuple[int, int, int]]:
    """(fd, offset, nbytes) of each run of consecutive slots among ``payloads`` (each once)."""
    order = sorted({id(p): p for p in payloads}.values(), key=lambda p: (p.fd, p.offset))
    runs: list[tuple[int, int, int, int]] = []  # fd, offset, nbytes, slot end
    for p in order:
        end = p.offset + (p.slot.capacity if p.slot is not None else p.nbytes)
        if runs and runs[-1][0] == p.fd and runs[-1][3] == p.offset:
            fd, offset, _, _ = runs[-1]
            runs[-1] = (fd, offset, p.offset + p.nbytes - offset, end)
        else:
            runs.append((p.fd, p.offset, p.nbytes, end))
    return [(fd, offset, n) for fd, offset, n, _ in runs]
