"""The C library calls the disk store makes (Linux), each bound twice over: releasing the
interpreter lock around calls that block on the device, keeping it around calls that do not."""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from dataclasses import dataclass

__all__ = ["Libc"]

MADV_DONTNEED = 4
MADV_POPULATE_READ = 22  # Linux >= 5.14
MADV_POPULATE_WRITE = 23
FADV_WILLNEED, FADV_DONTNEED = 3, 4  # posix_fadvise advice
SYNC_OUT = 1 | 2 | 4  # sync_file_range: wait for earlier writeback, write, wait for it


@dataclass(frozen=True)
class Libc:
    """``wait_*`` release the interpreter lock around the call (it may wait for the device);
    ``held_*`` keep it (the call only queues I/O in the kernel, drops clean pages, or maps pages
    already in the page cache), so returning from them never waits for the lock, which a main
    thread busy in Python holds for up to the switch interval ([Note: disk read-ahead and
    write-behind])."""

    wait_madvise: ctypes._CFuncPtr
    wait_sync_range: ctypes._CFuncPtr
    held_fadvise: ctypes._CFuncPtr
    held_madvise: ctypes._CFuncPtr
    held_mincore: ctypes._CFuncPtr

    @staticmethod
    def load() -> Libc | None:
        """Linux's libc (``madvise``, ``sync_file_range``, ``posix_fadvise``, ``mincore``), or
        None elsewhere."""
        if not sys.platform.startswith("linux"):
            return None
        name = ctypes.util.find_library("c")
        fns = []
        i32, i64, ptr, size = ctypes.c_int, ctypes.c_int64, ctypes.c_void_p, ctypes.c_size_t
        for lib, fn, args in (
            (ctypes.CDLL, "madvise", [ptr, size, i32]),
            (ctypes.CDLL, "sync_file_range", [i32, i64, i64, ctypes.c_uint]),
            (ctypes.PyDLL, "posix_fadvise", [i32, i64, i64, i32]),
            (ctypes.PyDLL, "madvise", [ptr, size, i32]),
            (ctypes.PyDLL, "mincore", [ptr, size, ctypes.c_char_p]),
        ):
            f = getattr(lib(name, use_errno=True), fn)
            f.argtypes = args
            fns.append(f)
        return Libc(*fns)
