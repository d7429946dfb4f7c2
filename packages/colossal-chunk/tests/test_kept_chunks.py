"""Kept chunks ([Note: kept chunks]): never evicted nor displaced by a prefetch; parallel chunks
with no room on host or disk start on the compute tier and are kept; demand tracking; counted
staging copies."""

import pytest
import torch
from torch import nn

from colossal_chunk import AutoPolicy, ChunkConfig, ChunkManager
from colossal_contracts import CapacityError, StateTransitionError, TierName

ACC, HOST = TierName.ACCELERATOR, TierName.HOST
NUMEL = 256  # one parameter per chunk: 1 KiB in fp32


def _manager(acc: int, host: int | None = None) -> tuple[ChunkManager, list[str]]:
    params = [(f"p{i}", nn.Parameter(torch.full((NUMEL,), float(i)))) for i in range(4)]
    cfg = ChunkConfig(NUMEL, accelerator_bytes=acc, host_bytes=host, device="cpu", disk_bytes=0)
    m = ChunkManager(cfg, policy=AutoPolicy())
    m.register(params)
    return m, [n for n, _ in params]


def _use(m: ChunkManager, name: str, moment: int) -> None:
    m.set_moment(moment)
    m.access([name])
    m.release([name])


def test_a_kept_chunk_is_never_evicted_and_its_bytes_count_as_demand():
    m, names = _manager(acc=3 * 1024)
    states = m.add_parallel("state", torch.float32)
    m.move(states[0], ACC)
    m.books.keep_on_compute([states[0]])
    m.books.track_demand()
    for moment, name in enumerate(names * 2):  # room for one chunk beside the kept one
        _use(m, name, moment % 4)
        assert states[0].tier is ACC
    assert {d for d, _ in m.books.demand.values()} == {2 * 1024}  # the chunk in use + the kept one
    assert all(r <= 3 * 1024 for _, r in m.books.demand.values())
    m.books.keep_on_compute([states[0]], keep=False)
    for moment, name in enumerate(names):
        _use(m, name, moment)
    assert states[0].tier is HOST  # let go: furthest next use, evicted first
    with pytest.raises(StateTransitionError, match="move it to the compute tier"):
        m.books.keep_on_compute([states[0]])


def test_kept_chunks_that_fill_the_room_leave_an_access_a_capacity_error():
    m, names = _manager(acc=3 * 1024)  # warmup share 80%: room for two chunks
    states = m.add_parallel("state", torch.float32)
    for s in states[:2]:
        m.move(s, ACC)
        m.books.keep_on_compute([s])
    with pytest.raises(CapacityError, match="kept there"):
        m.access([names[0]])


def test_parallel_chunks_with_no_host_room_start_on_the_compute_tier_within_the_reserve():
    m, _ = _manager(acc=8 * 1024, host=7 * 1024)  # the host holds 4 parameter + 3 state chunks
    states = m.add_parallel("state", torch.float32, spill_reserve=5 * 1024)
    tiers = [s.tier for s in states]
    # warmup share 80%: 6553 bytes of room, 5 KiB kept free: one 1 KiB chunk fits
    assert tiers.count(ACC) == 1, tiers
    with pytest.raises(CapacityError):
        m.add_parallel("other", torch.float32)  # no spill allowed: fits on no tier


def test_count_copy_shows_in_the_move_stats():
    m, _ = _manager(acc=4 * 1024)
    before = m.books.stats().bytes_moved
    m.books.count_copy(ACC, HOST, 100)
    m.books.count_copy(HOST, HOST, 50)  # same tier: not a move
    assert m.books.stats().bytes_moved - before == 100
