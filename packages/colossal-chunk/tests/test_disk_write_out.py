"""How a write-out is given to the device ([Note: reads first], [Note: whole payloads while reads
are idle]): a payload at a time while no read is in flight, a small piece at a time while one
is, every byte written either way."""

import torch

from colossal_chunk.disk import _io as _disk
from colossal_chunk.disk._io import DiskIO
from colossal_chunk.disk._store import DiskStore

NUMEL = _disk._WRITE_PIECE_IDLE // 4  # one fp32 payload of the idle piece's size


def _write_three(store: DiskStore, first: int) -> list[torch.Tensor]:
    """Three payloads in consecutive slots, put and written behind."""
    ts = []
    for i in range(first, first + 3):
        ts.append(store.put(f"w-{i}", torch.full((NUMEL,), float(i))))
        store.write_behind(f"w-{i}", ts[-1])
    store.drain()
    return ts


def test_a_write_out_goes_a_payload_at_a_time_unless_a_read_is_in_flight(tmp_path, monkeypatch):
    store = DiskStore(tmp_path)
    pieces: list[int] = []
    write_out = DiskIO._write_out
    monkeypatch.setattr(
        DiskIO,
        "_write_out",
        lambda self, piece: pieces.append(piece[2]) or write_out(self, piece),
    )
    ts = _write_three(store, 0)
    assert sum(pieces) == 3 * NUMEL * 4
    assert set(pieces) == {_disk._WRITE_PIECE_IDLE}  # no read in flight: whole payloads
    pieces.clear()
    monkeypatch.setattr(_disk, "_READS_FIRST_S", 0.001)  # a read that never ends: do not wait long
    store._io.in_flight[0].start()  # a read in flight for the whole write-out
    try:
        ts += _write_three(store, 3)
    finally:
        store._io.in_flight[0].end(0)
    assert sum(pieces) == 3 * NUMEL * 4
    assert set(pieces) == {_disk._WRITE_PIECE}  # a read waits behind one small piece at most
    raw = (tmp_path / "w.bin").read_bytes()
    on_disk = torch.frombuffer(bytearray(raw), dtype=torch.float32).view(6, NUMEL)
    assert all(on_disk[i].eq(float(i)).all() for i in range(6))  # every byte went out
    store.close()
