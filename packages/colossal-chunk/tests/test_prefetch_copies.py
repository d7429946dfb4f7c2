"""Prefetch copies on an emulated accelerator: a copy the worker thread has not started when it
is needed is made by the waiting thread, not waited for; one the worker made is waited for; a
small shard is moved at once by the prefetching thread ([Note: inline prefetch])."""

import threading

import pytest
import torch
from torch import nn

from colossal_chunk import AutoPolicy, ChunkConfig, ChunkManager
from colossal_chunk._prefetch import Prefetcher
from colossal_contracts import TierName


def _wait_in_thread(pending) -> tuple[threading.Thread, list[torch.Tensor]]:  # type: ignore[no-untyped-def]
    out: list[torch.Tensor] = []
    t = threading.Thread(target=lambda: out.append(pending.wait()), daemon=True)
    t.start()
    return t, out


def test_a_copy_the_worker_has_not_started_is_made_by_the_waiting_thread():
    pf = Prefetcher(torch.device("cpu"))
    gate = threading.Event()
    pf._pool.submit(gate.wait)  # the only worker is busy until the gate opens
    src, dst = torch.arange(4096.0), torch.empty(4096)
    t, out = _wait_in_thread(pf.copy(dst, src))
    t.join(timeout=60)  # waiting for the worker would block until the gate opens: never
    done = not t.is_alive()
    gate.set()
    pf.close()
    assert done and out[0] is dst and torch.equal(dst, src)


def test_a_copy_the_worker_made_is_waited_for():
    pf = Prefetcher(torch.device("cpu"))
    src, dst = torch.arange(4096.0), torch.empty(4096)
    pending = pf.copy(dst, src)
    pending._future.result()  # the worker made it
    assert pending.wait() is dst and torch.equal(dst, src)
    pf.close()


@pytest.mark.parametrize("inline", [True, False])
def test_a_small_shard_is_prefetched_at_once_a_large_one_by_the_worker(inline):
    numel = 1024  # one parameter per chunk: 4 KiB
    params = [(f"p{i}", nn.Parameter(torch.full((numel,), float(i)))) for i in range(3)]
    cfg = ChunkConfig(numel, accelerator_bytes=8 * numel * 4, device="cpu", disk_bytes=0)
    policy = AutoPolicy()
    m = ChunkManager(cfg, policy=policy)
    m.register(params)
    chunks = [m.chunk_of(n) for n, _ in params]
    for c in chunks:
        m.move(c, TierName.HOST)
    policy.set_schedule([[c.chunk_id] for c in chunks])
    placement = m._placement
    if not inline:
        placement.inline_copy_bytes = chunks[0].shard_bytes - 1
    moved = m.books.stats().bytes_moved
    m.set_moment(0, prefetch=1)  # moment 1's chunk
    c1 = chunks[1]
    assert (c1.tier is TierName.ACCELERATOR) is inline  # a move made at once
    assert (c1.prefetch is not None) is not inline  # a copy on the worker
    assert m.books.stats().bytes_moved - moved == c1.shard_bytes  # counted either way
    m.access(["p1"])
    assert c1.tier is TierName.ACCELERATOR and torch.equal(c1.view("p1"), params[1][1].data)
    assert torch.all(c1.view("p1") == 1.0)
    m.close()
