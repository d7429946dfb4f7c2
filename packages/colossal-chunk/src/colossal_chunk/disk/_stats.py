"""What the disk tier's background I/O moved, and for how long the device had it in flight.

[Note: in-flight time] A tier's throughput is its bytes over the seconds during which at least
one of its operations (reads, or writes) was in flight: from the call that issues it to the end
of the background job that completes it, overlapping operations counted once. That is how a
plain sequential file is timed (first call to the last), so the two rates compare. The end is
taken on the job's thread, so the seconds include that thread's waits for the interpreter lock
and for a CPU until it sees the operation done. A payload put on disk (``DiskStore.put``) is in
flight from the ``pwrite`` that copies it into the page cache, as a plain file's first
``write`` call starts its clock.

[Note: busy time] While reads and writes are both in flight, each direction's seconds count that
stretch, so the two rates together claim more seconds than passed; a write-out that waits for
the reads ([Note: reads first] in ``disk/_io.py``) is in flight the whole time the device reads.
``busy_s`` counts each second once: the seconds during which any of the tier's operations was in
flight. Bytes read and written over ``busy_s`` is the tier's throughput with the device shared,
comparable with a plain sequential read and write of the same sizes done one after the other
(the sum of their times).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

__all__ = ["DiskIOStats", "InFlight", "ReadRecord"]


@dataclass(frozen=True)
class DiskIOStats:
    """What the disk tier's background threads did ([Note: in-flight time]).

    Attributes:
        bytes_read: bytes read ahead from payload files.
        read_s: seconds during which at least one read was in flight.
        bytes_written: bytes written behind to the device ([Note: scratch payloads]).
        write_s: seconds during which at least one write was in flight.
        busy_s: seconds during which at least one read or write was in flight ([Note: busy
            time]); ``max(read_s, write_s) <= busy_s <= read_s + write_s``.
    """

    bytes_read: int = 0
    read_s: float = 0.0
    bytes_written: int = 0
    write_s: float = 0.0
    busy_s: float = 0.0

    def __sub__(self, other: DiskIOStats) -> DiskIOStats:
        return DiskIOStats(
            self.bytes_read - other.bytes_read,
            self.read_s - other.read_s,
            self.bytes_written - other.bytes_written,
            self.write_s - other.write_s,
            self.busy_s - other.busy_s,
        )


@dataclass(frozen=True)
class ReadRecord:
    """One read-ahead, for profiling (``time.perf_counter`` seconds): ``issued`` (the caller's
    call), ``started`` (the reader thread took it up), ``ended`` (its pages mapped); ``cached``:
    every page was in the page cache when the reader took it up (the device was done first)."""

    issued: float
    started: float
    ended: float
    nbytes: int
    cached: bool


class InFlight:
    """Bytes done and seconds with at least one operation in flight, for one kind of operation.

    Invariant: every ``start`` is followed by exactly one ``end`` (with 0 bytes when the
    operation did not happen); ``open`` counts those not ended yet. Each is passed on to
    ``also`` (the counter of every kind together: [Note: busy time]). Thread-safe.
    """

    def __init__(self, also: InFlight | None = None) -> None:
        self._also = also
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)  # notified when ``open`` drops to 0
        self.open = 0
        self._since = 0.0  # when ``open`` last went from 0 to 1
        self._bytes = 0
        self._seconds = 0.0

    def start(self) -> None:
        """One more operation is in flight from now."""
        if self._also is not None:
            self._also.start()
        with self._lock:
            if self.open == 0:
                self._since = time.perf_counter()
            self.open += 1

    def end(self, nbytes: int) -> None:
        """One operation in flight is done, having moved ``nbytes``."""
        now = time.perf_counter()
        with self._lock:
            self._bytes += nbytes
            self.open -= 1
            if self.open == 0:
                self._seconds += now - self._since
                self._idle.notify_all()
        if self._also is not None:
            self._also.end(nbytes)

    def wait_idle(self, timeout: float) -> bool:
        """Wait until none is in flight, at most ``timeout`` seconds; whether none is."""
        with self._lock:
            return self._idle.wait_for(lambda: self.open == 0, timeout)

    def totals(self) -> tuple[int, float]:
        """(bytes, seconds) so far, the current in-flight stretch counted up to now."""
        now = time.perf_counter()
        with self._lock:
            return self._bytes, self._seconds + (now - self._since if self.open else 0.0)
