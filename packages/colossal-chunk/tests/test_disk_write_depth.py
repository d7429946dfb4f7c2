"""[Note: deeper writes while no read waits]: write-behinds queue up to ``_MAX_BEHIND_IDLE``
bytes without waiting while no read-ahead is queued or in flight, and only ``_MAX_BEHIND``
while one is; the idle bound holds whatever the reads."""

import threading

import torch

from colossal_chunk.disk import _io
from colossal_chunk.disk._io import DiskIO, Payload

MiB = 1 << 20


def _queue(io: DiskIO, payloads: int, nbytes: int, fallback_s: float) -> tuple[int, bool]:
    """Issue ``payloads`` write-behinds of ``nbytes`` each to a writer that writes nothing until
    released; the most bytes that were behind at once without the caller waiting, and whether
    the caller had to wait (a fallback releases the writer then)."""
    gate, waited = threading.Event(), []
    io._write = lambda: gate.wait()  # type: ignore[method-assign]  # a writer that is busy
    fallback = threading.Timer(fallback_s, lambda: (waited.append(True), gate.set()))
    fallback.start()
    most = 0
    try:
        for _ in range(payloads):
            p = Payload(None, None, -1, 0, 0, nbytes, [])
            io.write_behind(p, torch.empty(0))
            most = max(most, sum(n for j, n in io._behind if not j.done()))
    finally:
        fallback.cancel()
        gate.set()
        io.close()
    return most, bool(waited)


def test_the_write_queue_deepens_while_no_read_waits():
    io = DiskIO(None, drop_cache=False)
    assert io.behind_limit == _io._MAX_BEHIND_IDLE > _io._MAX_BEHIND
    most, waited = _queue(
        io, 8, 8 * MiB, 30.0
    )  # 64 MiB: over the read-time bound, under the idle one
    assert not waited and most == 64 * MiB


def test_a_read_waiting_keeps_the_queue_short_and_the_idle_bound_holds():
    io = DiskIO(None, drop_cache=False)
    io.in_flight[0].start()  # a read-ahead in flight
    assert io.behind_limit == _io._MAX_BEHIND
    io.in_flight[0].end(0)
    assert io.behind_limit == _io._MAX_BEHIND_IDLE
    # past the idle bound the caller waits for the writer (here: for the fallback's release)
    most, waited = _queue(DiskIO(None, drop_cache=False), 14, 8 * MiB, 1.0)
    assert waited and most <= _io._MAX_BEHIND_IDLE + 8 * MiB
