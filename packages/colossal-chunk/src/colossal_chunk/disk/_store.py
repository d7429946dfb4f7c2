"""Chunk payloads kept in files on disk, memory-mapped so that they read back as CPU tensors.

[Note: disk payloads] Each payload is one slot of a file it shares with the payloads of its
kind ([Note: disk payload layout]), preallocated (``posix_fallocate``: a full filesystem fails
the allocation with a ``CapacityError`` instead of a SIGBUS at the first write through the
mapping, and write-back allocates no blocks) and mapped shared (``mmap`` of its range): writes
go to the file, reads page in on demand. A new payload is
written whole next (the move that created it), so its pages are mapped writable in one call
(``MADV_POPULATE_WRITE``) instead of one fault per page. Files live in one directory the user
picks (default: a fresh temporary directory); ``close()`` removes every file, and the directory
too when the store created it (also when the store is garbage-collected or the interpreter exits
without ``close``).

[Note: payloads put] A chunk moved to disk is written into its slot with ``pwrite`` (``put``)
rather than copied through a fresh mapping: a write of whole pages into the page cache reads
nothing, so the slot's old blocks are overwritten in place ([Note: disk payload layout]) and no
page of the mapping is faulted in or counted in the process's resident memory; the payload is
mapped afterwards, its pages found in the page cache. A tensor off the host (a CUDA shard) is
copied through the mapping of an ``allocate``d payload instead. Copied through a fresh mapping,
the page faults of ``MADV_POPULATE_WRITE`` read around the slot: on the training thread, the
next payloads of the file came into the page cache (5.4 GiB over a warmup and three steps of GPT
83 x 512 under 32 MiB + 512 MiB + 4 GiB, against 21 MiB put), off every read-ahead's books. With
``put`` those steps took 0.69-0.96x as long (five A/B pairs).

[Note: scratch payloads] Payloads are a spill space, never read after the process ends, so
writing one out needs its pages on the device, not a durable file: ``sync_file_range`` (write,
wait) instead of ``fdatasync``, which also commits the filesystem journal once per file (one
commit per payload, each a few MiB, was where the tier lost against one sequential file).

[Note: disk read-ahead and write-behind] Background threads keep disk traffic off the critical
path: two readers ([Note: two readers]) and a writer. ``read_ahead(key)`` brings a payload
into memory before it is used (the manager issues it for chunks the plan says come next):
``MADV_POPULATE_READ`` over the payload's own mapping (held while it runs) reads the file and
maps its pages into the process in one call, so the later access takes no page fault; without it (another kernel, the mapping gone) the file is
read sequentially into the page cache through one reused block buffer. The reader's populate
does the kernel's read itself ([Note: no read queued at issue]). Each interpreter-lock
hand-over costs the reader up to the 5 ms switch interval while the main thread runs Python, so
it takes as few as it can: a job maps every read-ahead queued while it runs (one wake-up for the reads issued
together, soonest first, taken one at a time), and a payload whose pages are all in the page
cache already (``mincore``) is mapped keeping the lock (no device wait, so no hand-over back);
only one still being read is waited for with the lock released. A payload about to be used
whose read-ahead the reader has not taken up yet is mapped by its user (``finish_read``, which
the owner calls before it reads a disk payload): the user neither waits for the reader to get
the lock nor faults the pages in beside it, and the read is over when the data is in. A write-behind or ``discard`` of a payload
drops its read-ahead not taken up yet (it reads nothing) and waits for one being mapped, so no
read maps pages again after their unmap ([Note: read-ahead window] in ``disk/_read_ahead.py``).
``write_behind(key, tensor)`` is issued once a payload was written (moved to disk, or updated in
place by the optimizer): it unmaps the payload's pages from this process at once, on the
caller's thread (``madvise(MADV_DONTNEED)``: dirty data moves to the page cache, nothing is
lost), so the process's resident memory holds only the disk pages in use; then the writer thread
writes it out ([Note: scratch payloads]) and, with ``drop_cache``, drops its pages from the page
cache: every write-behind queued when it runs, each run of consecutive slots of a file in
pieces ([Note: reads first], [Note: whole payloads while reads are idle]), then dropped whole
([Note: dropped whole]).
The caller does not start a write (its ``SYNC_FILE_RANGE_WRITE`` left some payloads' pages in the
page cache after the writer's wait and drop, measured with ``fincore``; likely the large folios
of [Note: dropped whole]). A write job holds the tensor it works on and a read its mapping, so the mapping stays alive;
``discard`` waits for a key's reads and writes before freeing its slot. Written pages are page cache until written out, so a writer waits once
more than 32 MiB are behind (back-pressure): the page cache the disk tier dirties stays bounded
by that window.
``io_stats`` counts bytes, and seconds during which at least one read (or write, or either)
was in flight ([Note: in-flight time], [Note: busy time] in ``disk/_stats.py``); a payload
``put`` is in flight from its ``pwrite``.

[Note: reads let go] A payload that was only read in place (a gradient the optimizer step
consumed, a shard a checkpoint saved) has clean pages: ``let_go`` unmaps them and drops them
from the page cache on the caller's thread, without a write job. Handing it to
``write_behind`` instead cost a writer job per payload, counted its bytes as written (a quarter
of the bytes "written" per step in training under a disk tier, at almost no device time, so
the tier's write rate read high) and took room in the back-pressure window.

[Note: reads first] A read is on the step's path (its chunk is used next), a write-behind is
not (its payload was used already, and the back-pressure window bounds what waits), and the
device serves both at once more slowly than either alone. So a write-out starts once no
read-ahead is in flight, or after waiting ``_READS_FIRST_S`` for them. Probed in training (GPT
20 x 512 under 32 MiB + 128 MiB + disk, loaded machine, trials alternated): the tier read at
482 and 596 MiB/s against 394 and 552 without, and steps took 0.95x as long; writes did not
slow. A read issued while a write-out runs still waits behind it on the device, so a write-out
is given to the device ``_WRITE_PIECE`` bytes at a time, each piece waiting for the reads first:
a read waits behind at most one piece. Profiled on that model (every read recorded), four in
five reads overlapped a write-out of a whole 4 MiB payload and took 6.0 ms against 1.9 for the
rest; with 1 MiB pieces those took 4.1-4.5 ms and the tier read at 1684-1944 MiB/s against
1468-1548 (two A/B pairs; 2 MiB pieces 1450, 512 KiB 1660), and steps did not slow.
Tried again with the pieces put whole ([Note: payloads put]): the writer starting the next
piece (``SYNC_FILE_RANGE_WRITE``) before waiting for the current one, so the device always had one
queued. In training (GPT 83 x 512 under 32 MiB + 512 MiB + 4 GiB, four A/B pairs) it wrote faster
in three (median +7%) and read 1-11% slower, within the run-to-run noise; four pieces ahead
while no read was in flight wrote 4-5% faster, read 5-9% slower, and the steps were longer. Not
kept.

[Note: no read queued at issue] A read-ahead used to be queued in the kernel by its caller
(``POSIX_FADV_WILLNEED`` on the training thread), so the device read while the reader thread
waited to run. Profiled with ``perf`` in training (GPT 83 x 512 under 32 MiB + 512 MiB + 4 GiB),
that call was a tenth of the machine's CPU time, on the training thread: it fills the page
cache a small page at a time (``force_page_cache_ra``). Without it the reader's populate reads
through the page-fault path, in larger requests (6.4-7.4 thousand device reads over three steps
against 11.4-11.8 thousand for the same bytes) into pages that later cost less to map, write
and drop. Runs of that model alternated with and without it (three with, five without): the
tier read at 1613-1948 MiB/s without the call against 1162-1289 with it; writes and steps moved
within the noise from this alone, and gained with [Note: whole payloads while reads are idle].

[Note: whole payloads while reads are idle] A write-out given to the device a 1 MiB piece at a
time ([Note: reads first]) pays each piece's submission and completion in the writer thread,
with nothing else queued: sampled in training (the device's own in-flight counters against the
tier's), the tier had a write in flight and the device nothing for a quarter of the step, the
writer in ``sync_file_range``. So while no read is in flight a write-out goes out in pieces of
``_WRITE_PIECE_IDLE`` (a payload's size) instead; a read issued meanwhile waits behind at most
one of them. A/B in training (GPT 83 x 512, as above, both without the queued read): the tier
wrote at 555 and 551 MiB/s against 446 and 395, steps took 10.6 and 10.4 s against 11.8 and
13.3, reads did not slow (1907 and 1662 against 1891 and 1613). Pieces of 16 MiB wrote no
faster and read slower.

[Note: staged updates] The optimizer updates a disk payload it reads and writes (fp32 values,
Adam states) on a host copy (``stage``), and writes the result back into the slot with
``pwrite`` (``unstage``), instead of computing in place through the mapping. In place, every
4 KiB page of the mapping took a write fault on its first store (``page_mkwrite``, the
filesystem's buffer heads): ``perf`` in training (GPT 83 x 512 under 32 MiB + 512 MiB + 4 GiB)
put about 3 s of CPU per step there, on the training thread and torch's second thread. The copy
reads pages already read ahead, and the mapping's pages leave the process as each piece is
copied, so the copy replaces them in resident memory rather than adding to it (by at most a
piece: ``lazy_rss``'s training peaks were 11.2 MiB over H + B at depth 18 with it, 11.35
without). Pages written with ``pwrite``
also cost less to write out. A/B in training, alternated, two pairs: steps took 10.5 and 9.3 s
against 11.9 and 12.3, the tier wrote at 561 and 612 MiB/s against 498 and 487, the training
thread used 21.0 and 19.8 s of CPU over the three steps against 25.3 and 25.4 (a first version
that copied with ``clone()``, whose blocks the C heap kept: 20 MiB more resident after each
step; this one ran once at 9.96 s per step, 560 MiB/s, the resident memory back where it was).

[Note: two readers] Two reader threads map read-aheads, so two are in flight on the device at
once: with one, a populate at a time kept the virtual disk one payload's requests deep, and
(likely the larger part) a read that waited behind a write piece ([Note: reads first]) held up
every read queued after it. Alternated trials in training (GPT 83 x 512 under 32 MiB + 512 MiB + 4 GiB, a slow spell of the machine):
the tier read at 1411 and 1232 MiB/s against 1099 and 1063 with one reader, wrote at 394 and
358 against 335 and 326, and steps took 14.0 and 16.1 s against 16.9 and 17.1.

Tried and not kept: direct writes (``O_DIRECT``) of the host copies ``unstage`` writes back, from
the copy itself on the writer thread, skipping the page cache. Alone on this machine's disk,
with both cores busy multiplying matrices, they wrote 1 GiB in 4 MiB pieces over written blocks
at 2009-2049 MiB/s for 0.04-0.05 s of the writer's CPU, against 858-862 MiB/s and 0.30-0.42 s
through the page cache. In training (as above, eleven trials alternated, one reader) the
process used 3-16% less CPU, but in five of six pairings the tier read 6-17% slower and steps
took 1.4-2.1 s longer (the sixth: reads 9% faster, the step 0.6 s shorter); writes were 8-9%
faster with 8 MiB of copies held until written, 11% slower to 7% faster with 32 MiB. Again with
two readers, two pairs: steps took 20.3 and 18.1 s against 14.7 and 15.5, reads 975 and 1056
MiB/s against 1409 and 1203. The copies are host memory held until the device has written
them, and a payload's file is stale until then (every read must wait for it).

[Note: dropped whole] Pages written with ``pwrite`` ([Note: payloads put]) sit in the page cache
as large folios, and ``POSIX_FADV_DONTNEED`` over a range drops no folio that straddles its
ends: after each 1 MiB piece was dropped on its own, every page of a 4 MiB payload put whole was
still cached (``mincore``). So each run of slots written out is dropped once more whole, after
its last piece (``tests/test_disk_put.py``).
"""

from __future__ import annotations

import ctypes
import mmap
import os
import shutil
import tempfile
import threading
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from colossal_contracts import ConfigError

from .._host_memory import host_empty
from ._check import check_disk_dir
from ._files import Slot, SlotFile, SlotFiles
from ._libc import (
    FADV_DONTNEED,
    MADV_DONTNEED,
    MADV_POPULATE_READ,
    MADV_POPULATE_WRITE,
    SYNC_OUT,
    Libc,
)
from ._stats import DiskIOStats, InFlight, ReadRecord

__all__ = ["DiskIOStats", "DiskStore", "ReadRecord", "check_disk_dir"]

_READ_BLOCK = 8 << 20  # bytes per pread of a read-ahead
_READERS = 2  # reader threads: read-aheads in flight on the device at once ([Note: two readers])
_MAX_BEHIND = 32 << 20  # bytes written but not yet written behind before a writer waits
_READS_FIRST_S = 0.02  # longest a write-out waits for the reads in flight ([Note: reads first])
_WRITE_PIECE = 1 << 20  # bytes a write-out gives the device at once ([Note: reads first])
_WRITE_PIECE_IDLE = 4 << 20  # the same while no read is in flight ([Note: whole payloads ...])


@dataclass
class _Payload:
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
    p: _Payload
    tensor: torch.Tensor  # held: the mapping stays alive until it is written out


class DiskStore:
    """Memory-mapped payloads in files of ``directory``; see [Note: disk payloads] and
    [Note: disk payload layout].

    Invariant: ``key in self`` exactly while a slot of a file holds ``key``'s payload.
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
        self._slots = SlotFiles(self._dir)
        self._remove = weakref.finalize(self, _remove_all, self._slots, self._dir, self._owns_dir)
        self._drop_cache = drop_cache
        self._warm: set[str] = set()  # keys read ahead since they were last written
        self._lock = threading.Lock()
        self._busy = InFlight()  # either kind ([Note: busy time])
        # reads, writes ([Note: in-flight time])
        self._in_flight = (InFlight(self._busy), InFlight(self._busy))
        self._reader: ThreadPoolExecutor | None = None
        self._reads: list[_Payload] = []  # read-aheads issued, not yet taken by the reader
        self._records: list[ReadRecord] | None = None  # reads done, while recording
        # the readers' block buffer: shared, what is read into it is never used
        self._read_buf: mmap.mmap | None = None
        self._behind: list[tuple[Future[None], int]] = []  # write-behinds in flight, oldest first
        self._writer: ThreadPoolExecutor | None = None
        self._writes: list[_Write] = []  # write-behinds not yet taken by the writer
        self._libc = Libc.load()
        self._madvise = None if self._libc is None else self._libc.wait_madvise

    @property
    def directory(self) -> Path:
        return self._dir

    def __contains__(self, key: str) -> bool:
        return key in self._files

    def allocate(self, key: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A 1-D tensor of ``numel`` elements backed by a new file; its content is zeros."""
        t, zeros = self._new(key, numel, dtype, zeros=True)
        base = t.untyped_storage().data_ptr()
        if numel and self._madvise is not None and base % mmap.PAGESIZE == 0:
            # the caller writes the whole payload next: map every page writable in one call
            # instead of one fault per page (a no-op where the kernel lacks it)
            self._madvise(base, t.nbytes, MADV_POPULATE_WRITE)  # type: ignore[operator]
        if not zeros:  # a reused slot whose old bytes could not be punched out
            t.zero_()
        return t

    def put(self, key: str, src: torch.Tensor) -> torch.Tensor:
        """A payload holding ``src``'s values (a 1-D contiguous tensor), as a 1-D tensor mapping
        it ([Note: payloads put]). The caller issues its ``write_behind`` next; the write is in
        flight from the ``pwrite`` on (from the ``write_behind`` for a source off the host,
        copied through the mapping)."""
        if src.device.type != "cpu":  # pwrite reads host memory: copy through the mapping
            t = self.allocate(key, src.numel(), src.dtype)
            t.copy_(src)
            return t
        t, _ = self._new(key, src.numel(), src.dtype, zeros=False)  # maps nothing in yet
        try:
            self._pwrite(self._files[key], src)
        except BaseException:
            self.discard(key)  # ends the write, having written nothing
            raise
        return t

    def stage(self, key: str, tensor: torch.Tensor) -> torch.Tensor:
        """A host copy of ``key``'s payload (``tensor``, its mapping) to compute on, its
        read-ahead done first; the payload's pages then leave this process (clean: nothing is
        lost). ``unstage`` writes the result back ([Note: staged updates])."""
        self.finish_read(key)  # no read maps the pages again after the unmaps below
        # its own mapping, unmapped when dropped; small pages: resident as far as it is copied
        copy = host_empty(tensor.numel(), tensor.dtype, huge=False)
        src, dst = tensor.view(torch.uint8), copy.view(torch.uint8)
        p = self._files.get(key)
        unmap = p is not None and self._can_unmap(p, tensor)
        for at in range(0, src.numel(), _WRITE_PIECE):  # a piece at a time: the pages of the
            n = min(_WRITE_PIECE, src.numel() - at)  # payload not read ahead are faulted in by
            dst[at : at + n].copy_(src[at : at + n])  # the copy, and leave once copied
            if unmap:
                self._madvise(p.base + at, n, MADV_DONTNEED)  # type: ignore[operator, union-attr]
        return copy

    def unstage(self, key: str, src: torch.Tensor) -> None:
        """Write ``src`` (a 1-D contiguous host tensor of the payload's size, from ``stage``)
        into ``key``'s payload with ``pwrite`` ([Note: staged updates]); the caller issues its
        ``write_behind`` next (the write is in flight from here)."""
        p = self._files[key]
        if src.numel() * src.element_size() != p.nbytes:
            raise ValueError(
                f"unstage({key!r}): a copy of {src.numel() * src.element_size()} bytes for a "
                f"payload of {p.nbytes}; pass the copy stage() returned"
            )
        self._pwrite(p, src)

    def _pwrite(self, p: _Payload, src: torch.Tensor) -> None:
        """Write ``src``'s bytes into ``p``'s slot, whole pages ([Note: payloads put]); the write
        is in flight from here until its write-behind is done ([Note: in-flight time])."""
        if p.nbytes == 0:
            return
        if not p.put_open:
            self._in_flight[1].start()
            p.put_open = True
        data = memoryview(src.detach().reshape(-1).view(torch.uint8).numpy())
        pad = bytes(-p.nbytes % mmap.PAGESIZE)  # whole pages: none is read to be merged
        done, total = 0, p.nbytes + len(pad)
        while done < total:
            bufs = [data[done:], pad] if done < p.nbytes else [pad[done - p.nbytes :]]
            done += os.pwritev(p.fd, bufs, p.offset + done)

    def _new(
        self, key: str, numel: int, dtype: torch.dtype, *, zeros: bool
    ) -> tuple[torch.Tensor, bool]:
        """A new payload for ``key`` in a slot (see ``SlotFiles.take`` for ``zeros``), mapped
        as a 1-D tensor of ``numel`` elements, and whether its bytes read as zeros."""
        self.discard(key)
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        if numel == 0:
            self._files[key] = _Payload(None, None, -1, 0, 0, 0, [])
            return torch.empty(0, dtype=dtype), True
        f, slot, reads_zeros = self._slots.take(key, nbytes, zeros=zeros)
        mm = mmap.mmap(f.fd, nbytes, offset=slot.offset)  # shared: writes go to the file
        t = torch.frombuffer(mm, dtype=dtype, count=numel)  # keeps ``mm`` mapped while alive
        base = t.untyped_storage().data_ptr()
        self._files[key] = _Payload(f, slot, f.fd, slot.offset, base, nbytes, [], weakref.ref(mm))
        return t, reads_zeros

    def remap(self, key: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """``key``'s payload as it is, mapped again as a 1-D tensor of ``numel`` elements (its
        earlier mapping was dropped: [Note: disk copies] in ``disk/_copies.py``). It counts as
        not read ahead: its pages may have left the page cache since."""
        p = self._files[key]
        self._warm.discard(key)
        if p.nbytes == 0:
            return torch.empty(0, dtype=dtype)
        mm = mmap.mmap(p.fd, p.nbytes, offset=p.offset)  # shared, as ``allocate``'s
        t = torch.frombuffer(mm, dtype=dtype, count=numel)  # keeps ``mm`` mapped while alive
        p.base, p.mapping = t.untyped_storage().data_ptr(), weakref.ref(mm)
        return t

    # ----- background I/O ([Note: disk read-ahead and write-behind]) ----------------------------
    def is_read_ahead(self, key: str) -> bool:
        """Whether ``key``'s payload was read ahead since it was last written (or created)."""
        return key in self._warm

    def read_ahead(self, key: str) -> None:
        """Start reading ``key``'s file into the page cache (no-op if read since last written)."""
        p = self._files.get(key)
        if p is None or p.nbytes == 0 or key in self._warm:
            return
        self._warm.add(key)
        if self._reader is None:
            self._reader = ThreadPoolExecutor(_READERS, "colossal-disk-read")
        self._in_flight[0].start()  # the reader's populate reads ([Note: no read queued at issue])
        p.read, p.issued = threading.Event(), time.perf_counter()
        with self._lock:
            self._reads.append(p)
        self._reader.submit(self._read)

    def write_behind(self, key: str, tensor: torch.Tensor) -> None:
        """Start writing ``key``'s payload (``tensor``, its mapping) to the device and dropping
        its pages from this process's memory."""
        p = self._unmap(key, tensor)
        if p is None:
            return
        if self._writer is None:
            self._writer = ThreadPoolExecutor(1, "colossal-disk-write")
        if not p.put_open:  # else in flight since its put
            self._in_flight[1].start()
        p.put_open = False
        w = _Write(p, tensor)
        with self._lock:
            self._writes.append(w)
        job = self._writer.submit(self._write)
        self._track(p, job)
        self._behind.append((job, p.nbytes))
        # back-pressure: dirty pages are host memory until written out, so bound them
        while sum(n for _, n in self._behind) > _MAX_BEHIND and len(self._behind) > 1:
            self._behind.pop(0)[0].result()
        self._behind = [(j, n) for j, n in self._behind if not j.done()]

    def let_go(self, key: str, tensor: torch.Tensor) -> None:
        """``key``'s payload (``tensor``, its mapping) was only read since it was last written:
        its pages leave this process's memory and, with ``drop_cache``, the page cache, with
        nothing to write out and no bytes counted as written ([Note: reads let go]). Pages
        written after all stay in the page cache, and the kernel's writeback keeps them."""
        p = self._unmap(key, tensor)
        if p is None:
            return
        if self._drop_cache and self._libc is not None:  # clean pages: dropping is cheap
            self._libc.held_fadvise(p.fd, p.offset, p.nbytes, FADV_DONTNEED)

    def _unmap(self, key: str, tensor: torch.Tensor) -> _Payload | None:
        """Drop ``key``'s pages from this process's memory now (cheap: its resident memory
        never holds more of the disk tier than the payloads in use; the page cache keeps dirty
        data), once no read-ahead can map them again; its payload, or None when it has none."""
        p = self._files.get(key)
        if p is None or p.nbytes == 0:
            return None
        if key in self._warm:  # a read-ahead not done yet would map the pages again after
            self._warm.discard(key)  # the unmap below: drop it if queued, else wait for it
            self._wait(p, drop_read=True)
        if self._can_unmap(p, tensor):
            self._madvise(p.base, p.nbytes, MADV_DONTNEED)  # type: ignore[operator]
        return p

    def _can_unmap(self, p: _Payload, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` is ``p``'s own page-aligned mapping and ``madvise`` can drop its
        pages from this process."""
        return (
            self._madvise is not None
            and tensor.untyped_storage().data_ptr() == p.base
            and p.base % mmap.PAGESIZE == 0
        )

    def drain(self) -> None:
        """Wait until every read-ahead and write-behind issued so far is done."""
        for p in list(self._files.values()):
            self._wait(p)

    def io_stats(self) -> DiskIOStats:
        """Bytes and seconds of background I/O since the store was created (seconds: while at
        least one read, or write, or either, was in flight; [Note: in-flight time], [Note: busy
        time])."""
        (r, rs), (w, ws) = (c.totals() for c in self._in_flight)
        return DiskIOStats(r, rs, w, ws, self._busy.totals()[1])

    def record_reads(self) -> list[ReadRecord]:
        """The read-aheads done since the last call, each with its timeline (for profiling:
        recording starts at the first call)."""
        with self._lock:
            got, self._records = self._records or [], []
        return got

    def _track(self, p: _Payload, job: Future[None]) -> None:
        p.jobs = [j for j in p.jobs if not j.done()]
        p.jobs.append(job)

    def _wait(self, p: _Payload, *, drop_read: bool = False) -> None:
        """Wait for ``p``'s read-ahead (with ``drop_read``, one not taken by the reader yet is
        dropped instead: it reads nothing) and its write-behinds."""
        if drop_read and self._unqueue(p):
            self._in_flight[0].end(0)
            p.read.set()  # type: ignore[union-attr]
        if p.read is not None:
            p.read.wait()
        jobs, p.jobs = p.jobs, []
        for j in jobs:
            j.result()

    def finish_read(self, key: str) -> None:
        """``key``'s payload is used now: its read-ahead not taken up by the reader yet is done
        on this thread (instead of waiting for the reader, or faulting the pages in beside it);
        one the reader is mapping is waited for. No-op when none is in flight."""
        p = self._files.get(key)
        if p is None or p.read is None or p.read.is_set():
            return
        if self._unqueue(p):
            self._map(p)
        else:
            p.read.wait()

    def _unqueue(self, p: _Payload) -> bool:
        """Take ``p``'s read-ahead off the reader's queue; whether it was there (not started)."""
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

    def _map(self, p: _Payload) -> None:
        """Do ``p``'s read-ahead on this thread; it is over when this returns (or raises:
        then it read nothing)."""
        started, n, cached = time.perf_counter(), 0, False
        try:
            n, cached = self._read_into(p)
        finally:
            self._in_flight[0].end(n)
            p.read.set()  # type: ignore[union-attr]
        r = ReadRecord(p.issued, started, time.perf_counter(), n, cached)
        with self._lock:
            if self._records is not None:
                self._records.append(r)

    def _read_into(self, p: _Payload) -> tuple[int, bool]:
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

    def _cached(self, p: _Payload) -> bool:
        """Whether every page of ``p``'s mapping is in the page cache (``mincore``)."""
        pages = -(-p.nbytes // mmap.PAGESIZE)
        vec = ctypes.create_string_buffer(pages)
        if self._libc is None or self._libc.held_mincore(p.base, p.nbytes, vec) != 0:
            return False
        return vec.raw.count(0, 0, pages) == 0  # bit 0 of each page's byte: resident

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
                    idle = self._in_flight[0].wait_idle(_READS_FIRST_S)  # [Note: reads first]
                    # [Note: whole payloads while reads are idle]
                    n = min(_WRITE_PIECE_IDLE if idle else _WRITE_PIECE, nbytes - at)
                    self._write_out((fd, offset + at, n))
                    at += n
            for run in runs:  # [Note: dropped whole]
                self._drop(run)
            done = True
        finally:
            for w in batch:
                self._in_flight[1].end(w.p.nbytes if done else 0)

    def _write_out(self, piece: tuple[int, int, int]) -> None:
        """Write ``piece`` (fd, offset, bytes) out and wait for it; then drop it from the page
        cache ([Note: scratch payloads]: written out, not made durable)."""
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

    # ----- lifetime -----------------------------------------------------------------------------
    def discard(self, key: str) -> None:
        """Free the slot of ``key`` (tensors still mapping it stay readable until dropped)."""
        p = self._files.pop(key, None)
        if p is not None:
            if p.put_open:  # put, never written behind: its write ends having written nothing
                p.put_open = False
                self._in_flight[1].end(0)
            self._wait(p, drop_read=True)
            self._warm.discard(key)
            if p.file is not None and p.slot is not None:
                mm = p.mapping() if p.mapping is not None else None
                self._slots.give_back(p.file, p.slot, mm)

    def close(self) -> None:
        """Remove every file, and the directory when this store created it."""
        for key in list(self._files):
            self.discard(key)
        for pool in (self._reader, self._writer):
            if pool is not None:
                pool.shutdown(wait=True)
        self._reader = self._writer = None
        self._remove()


def _runs(payloads: list[_Payload]) -> list[tuple[int, int, int]]:
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


def _remove_all(slots: SlotFiles, directory: Path, owns_dir: bool) -> None:
    slots.close()
    if owns_dir:
        shutil.rmtree(directory, ignore_errors=True)
