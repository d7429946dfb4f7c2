"""The disk tier's in-flight seconds ([Note: in-flight time], [Note: busy time]): a payload put is
in flight from its ``pwrite``; ``busy_s`` counts the seconds either kind was in flight once."""

import time

import torch

from colossal_chunk.disk._stats import InFlight
from colossal_chunk.disk._store import DiskStore


def test_busy_time_counts_overlapping_reads_and_writes_once(monkeypatch):
    now = [0.0]  # a clock the test moves
    monkeypatch.setattr("colossal_chunk.disk._stats.time.perf_counter", lambda: now[0])
    busy = InFlight()
    reads, writes = InFlight(busy), InFlight(busy)
    reads.start()  # reads: [0, 2] and [5, 6]; writes: [1, 3]; either: [0, 3] and [5, 6]
    now[0] = 1.0
    writes.start()
    now[0] = 2.0
    reads.end(10)
    now[0] = 3.0
    writes.end(20)
    now[0] = 5.0
    reads.start()
    now[0] = 6.0
    reads.end(1)
    assert reads.totals() == (11, 3.0) and writes.totals() == (20, 2.0)
    assert busy.totals() == (31, 4.0)  # not the 5.0 the two kinds claim together
    reads.start()
    now[0] = 6.5
    assert busy.totals() == (31, 4.5) and reads.totals() == (11, 3.5)  # counted up to now


def test_a_put_is_in_flight_from_its_pwrite_until_written_out(tmp_path, monkeypatch):
    store = DiskStore(tmp_path)
    src = torch.randn(1 << 18)
    pwritev = __import__("os").pwritev
    slow_pwrite = 0.15  # a slow copy into the page cache must count as write time

    def pwritev_slowly(fd, bufs, offset):  # type: ignore[no-untyped-def]
        time.sleep(slow_pwrite)
        return pwritev(fd, bufs, offset)

    monkeypatch.setattr("colossal_chunk.disk._store.os.pwritev", pwritev_slowly)
    t = store.put("param-0@disk", src)
    assert store.io_stats().write_s >= slow_pwrite  # in flight already, before write_behind
    store.write_behind("param-0@disk", t)
    store.drain()
    io = store.io_stats()
    assert io.bytes_written == src.numel() * 4 and io.write_s >= slow_pwrite
    assert io.busy_s >= io.write_s
    # once written out nothing is in flight: the clock stopped
    assert store.io_stats().write_s == io.write_s
    # a put never written behind ends, having written nothing, when its payload is discarded
    store.put("param-1@disk", src)
    store.discard("param-1@disk")
    after = store.io_stats()
    assert after.bytes_written == io.bytes_written
    time.sleep(0.05)
    assert store.io_stats().write_s == after.write_s
    store.close()
