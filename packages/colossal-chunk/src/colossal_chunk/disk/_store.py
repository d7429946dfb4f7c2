"""Chunk payloads kept in files on disk, memory-mapped so that they read back as CPU tensors.
The background reads and writes are ``DiskIO``'s (``disk/_io.py``). Measurements behind each
choice below are in docs/gemini.md ("The disk store's notes, measured").

[Note: disk payloads] Each payload is one slot of a file it shares with the payloads of its
kind ([Note: disk payload layout]), preallocated (``posix_fallocate``: a full filesystem fails
the allocation with a ``CapacityError`` instead of a SIGBUS at the first write through the
mapping, and write-back allocates no blocks) and mapped shared (``mmap`` of its range): writes
go to the file, reads page in on demand. A new payload is written whole next (the move that
created it), so its pages are mapped writable in one call (``MADV_POPULATE_WRITE``) instead of
one fault per page. Files live in one directory the user picks (default: a fresh temporary
directory); ``close()`` removes every file, and the directory too when the store created it
(also when the store is garbage-collected or the interpreter exits without ``close``).

[Note: payloads put] A chunk moved to disk is written into its slot with ``pwrite`` (``put``)
rather than copied through a fresh mapping: a write of whole pages into the page cache reads
nothing, so the slot's old blocks are overwritten in place and no page of the mapping is faulted
in; the payload is mapped afterwards, its pages found in the page cache. (Through a fresh
mapping, the page faults read around the slot: the next payloads of the file came into the page
cache on the training thread.) A tensor off the host is copied through the mapping of an
``allocate``d payload instead.

[Note: scratch payloads] Payloads are a spill space, never read after the process ends, so
writing one out needs its pages on the device, not a durable file: ``sync_file_range`` (write,
wait) instead of ``fdatasync``, which also commits the filesystem journal once per file.

[Note: reads let go] A payload that was only read in place (a gradient the optimizer step
consumed, a shard a checkpoint saved) has clean pages: ``let_go`` unmaps them and drops them
from the page cache on the caller's thread, without a write job (which would count its bytes as
written and take room in the back-pressure window).

[Note: staged updates] The optimizer updates a disk payload it reads and writes (fp32 values,
Adam states) on a host copy (``stage``), and writes the result back into the slot with
``pwrite`` (``unstage``), instead of computing in place through the mapping, where every 4 KiB
page took a write fault on its first store. The mapping's pages leave the process as each piece
is copied, so the copy replaces them in resident memory rather than adding to it (by at most a
piece). The copy is its own mapping (``host_empty``), unmapped when dropped: a ``clone()``'s
blocks stayed in the C heap.
"""

from __future__ import annotations

import mmap
import os
import shutil
import tempfile
import weakref
from pathlib import Path

import torch

from colossal_contracts import ConfigError

from .._host_memory import host_empty
from ._check import check_disk_dir
from ._files import SlotFiles
from ._io import _WRITE_PIECE, DiskIO, Payload
from ._libc import FADV_DONTNEED, MADV_DONTNEED, MADV_POPULATE_WRITE, Libc
from ._stats import DiskIOStats, ReadRecord

__all__ = ["DiskIOStats", "DiskStore", "ReadRecord", "check_disk_dir"]


class DiskStore:
    """Memory-mapped payloads in files of ``directory``; see [Note: disk payloads] and
    [Note: disk payload layout].

    Invariant: ``key in self`` exactly while a slot of a file holds ``key``'s payload.
    """

    _dir: Path
    _owns_dir: bool  # True when we created the directory and must remove it on close
    _files: dict[str, Payload]

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
        self._libc = Libc.load()
        self._madvise = None if self._libc is None else self._libc.wait_madvise
        self._io = DiskIO(self._libc, drop_cache=drop_cache)  # the background threads

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
            self._madvise(base, t.nbytes, MADV_POPULATE_WRITE)
        if not zeros:  # a reused slot whose old bytes could not be punched out
            t.zero_()
        return t

    def claim(self, key: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A payload for ``key`` holding whatever its slot holds (dead values: colossal-chunk's
        [Note: dead shards]), mapped with nothing mapped in and nothing to write out."""
        return self._new(key, numel, dtype, zeros=False)[0]

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
        madvise = self._madvise
        for at in range(0, src.numel(), _WRITE_PIECE):  # a piece at a time: the pages of the
            n = min(_WRITE_PIECE, src.numel() - at)  # payload not read ahead are faulted in by
            dst[at : at + n].copy_(src[at : at + n])  # the copy, and leave once copied
            if unmap and madvise is not None and p is not None:  # (unmap says both are)
                madvise(p.base + at, n, MADV_DONTNEED)
        return copy

    def unstage(self, key: str, src: torch.Tensor) -> None:
        """Write ``src`` (a 1-D contiguous host tensor of the payload's size, from ``stage``)
        into ``key``'s payload with ``pwrite`` ([Note: staged updates]); the caller issues its
        ``write_behind`` next (the write is in flight from here)."""
        p = self._files[key]
        if src.numel() * src.element_size() != p.nbytes:
            raise ConfigError(
                f"unstage({key!r}): a copy of {src.numel() * src.element_size()} bytes for a "
                f"payload of {p.nbytes}; pass the copy stage() returned"
            )
        self._pwrite(p, src)

    def _pwrite(self, p: Payload, src: torch.Tensor) -> None:
        """Write ``src``'s bytes into ``p``'s slot, whole pages ([Note: payloads put]); the write
        is in flight from here until its write-behind is done ([Note: in-flight time])."""
        if p.nbytes == 0:
            return
        if not p.put_open:
            self._io.in_flight[1].start()
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
            self._files[key] = Payload(None, None, -1, 0, 0, 0, [])
            return torch.empty(0, dtype=dtype), True
        f, slot, reads_zeros = self._slots.take(key, nbytes, zeros=zeros)
        mm = mmap.mmap(f.fd, nbytes, offset=slot.offset)  # shared: writes go to the file
        t = torch.frombuffer(mm, dtype=dtype, count=numel)  # keeps ``mm`` mapped while alive
        base = t.untyped_storage().data_ptr()
        self._files[key] = Payload(f, slot, f.fd, slot.offset, base, nbytes, [], weakref.ref(mm))
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
        self._io.read_ahead(p)

    def write_behind(self, key: str, tensor: torch.Tensor) -> None:
        """Start writing ``key``'s payload (``tensor``, its mapping) to the device and dropping
        its pages from this process's memory."""
        p = self._unmap(key, tensor)
        if p is not None:
            self._io.write_behind(p, tensor)

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

    def _unmap(self, key: str, tensor: torch.Tensor) -> Payload | None:
        """Drop ``key``'s pages from this process's memory now (cheap: its resident memory
        never holds more of the disk tier than the payloads in use; the page cache keeps dirty
        data), once no read-ahead can map them again; its payload, or None when it has none."""
        p = self._files.get(key)
        if p is None or p.nbytes == 0:
            return None
        if key in self._warm:  # a read-ahead not done yet would map the pages again after
            self._warm.discard(key)  # the unmap below: drop it if queued, else wait for it
            self._io.wait(p, drop_read=True)
        madvise = self._madvise
        if madvise is not None and self._can_unmap(p, tensor):
            madvise(p.base, p.nbytes, MADV_DONTNEED)
        return p

    def _can_unmap(self, p: Payload, tensor: torch.Tensor) -> bool:
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
            self._io.wait(p)

    def io_stats(self) -> DiskIOStats:
        """Bytes and seconds of background I/O since the store was created (seconds: while at
        least one read, or write, or either, was in flight; [Note: in-flight time], [Note: busy
        time])."""
        return self._io.stats()

    def record_reads(self) -> list[ReadRecord]:
        """The read-aheads done since the last call, each with its timeline (for profiling:
        recording starts at the first call)."""
        return self._io.record_reads()

    def finish_read(self, key: str) -> None:
        """``key``'s payload is used now: its read-ahead not taken up by a reader yet is done
        on this thread (instead of waiting for the reader, or faulting the pages in beside it);
        one a reader is mapping is waited for. No-op when none is in flight."""
        p = self._files.get(key)
        if p is not None:
            self._io.finish_read(p)

    # ----- lifetime -----------------------------------------------------------------------------
    def discard(self, key: str) -> None:
        """Free the slot of ``key`` (tensors still mapping it stay readable until dropped)."""
        p = self._files.pop(key, None)
        if p is not None:
            if p.put_open:  # put, never written behind: its write ends having written nothing
                p.put_open = False
                self._io.in_flight[1].end(0)
            self._io.wait(p, drop_read=True)
            self._warm.discard(key)
            if p.file is not None and p.slot is not None:
                mm = p.mapping() if p.mapping is not None else None
                self._slots.give_back(p.file, p.slot, mm)

    def close(self) -> None:
        """Remove every file, and the directory when this store created it."""
        for key in list(self._files):
            self.discard(key)
        self._io.close()
        self._remove()


def _remove_all(slots: SlotFiles, directory: Path, owns_dir: bool) -> None:
    slots.close()
    if owns_dir:
        shutil.rmtree(directory, ignore_errors=True)
