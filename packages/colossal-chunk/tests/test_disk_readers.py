"""Two reader threads ([Note: two readers]): two read-aheads are mapped at once, and every one
issued is mapped once, with its bytes counted once."""

import threading

import torch

from colossal_chunk.disk._io import DiskIO
from colossal_chunk.disk._store import DiskStore


def test_two_read_aheads_are_in_flight_at_once(tmp_path, monkeypatch):
    both = threading.Barrier(2, timeout=30)  # broken unless two reads run together
    read_into = DiskIO._read_into
    reading: list[str] = []

    def paired(self, p):  # type: ignore[no-untyped-def]
        reading.append(threading.current_thread().name)
        if len(reading) <= 2:
            both.wait()
        return read_into(self, p)

    monkeypatch.setattr(DiskIO, "_read_into", paired)
    store = DiskStore(tmp_path / "d")
    try:
        maps = {}
        for i in range(6):
            maps[i] = store.put(f"x-{i}@disk", torch.full((4096,), float(i)))
            store.write_behind(f"x-{i}@disk", maps[i])
        store.drain()
        for i in range(6):
            store.read_ahead(f"x-{i}@disk")
        store.drain()
        assert not both.broken
        assert len(reading) == 6 and len(set(reading[:2])) == 2  # on two threads
        assert all(n.startswith("colossal-disk-read") for n in reading)
        assert store.io_stats().bytes_read == 6 * 4096 * 4
        assert store._io.in_flight[0].open == 0
        for i in range(6):
            assert torch.equal(maps[i], torch.full((4096,), float(i)))
    finally:
        store.close()
