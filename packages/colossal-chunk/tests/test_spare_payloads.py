"""Spare payloads ([Note: spare payloads]): a move between the host and an emulated accelerator
copies into the payload the last move of that size freed, never into storage something else
still views, and values survive every move."""

import weakref

import pytest
import torch
from torch import nn

from colossal_chunk import AutoPolicy, ChunkConfig, ChunkManager
from colossal_chunk._spare import SPARE_BYTES
from colossal_contracts import TierName

ACC, HOST = TierName.ACCELERATOR, TierName.HOST
NUMEL = 256  # one parameter per chunk: 1 KiB in fp32


def _manager() -> ChunkManager:
    params = [(f"p{i}", nn.Parameter(torch.full((NUMEL,), float(i)))) for i in range(4)]
    cfg = ChunkConfig(NUMEL, accelerator_bytes=None, device="cpu", disk_bytes=0)
    m = ChunkManager(cfg, policy=AutoPolicy())
    m.register(params)
    return m


def test_a_move_copies_into_the_payload_the_last_move_freed():
    m = _manager()
    a, b = m.registry.param_chunks()[:2]
    m.move(a, ACC)
    freed = weakref.ref(a.shard)  # a's accelerator payload, freed by the next move
    m.move(a, HOST)
    assert freed() is not None  # kept as the spare
    m.move(b, ACC)
    assert b.shard is freed()  # b's copy went into it
    assert m._placement.spares.nbytes == a.shard_bytes  # b's host payload is the spare now
    for i, c in enumerate(m.registry.param_chunks()):
        m.move(c, ACC)
        m.move(c, HOST)
        assert torch.equal(c.view(f"p{i}"), torch.full((NUMEL,), float(i)))


@pytest.mark.parametrize("how", ["view", "storage"])
def test_a_payload_still_viewed_is_never_reused(how: str):
    m = _manager()
    a, b = m.registry.param_chunks()[:2]
    m.move(a, ACC)
    # someone (a saved tensor, say) still views a's payload: a view of the tensor, or another
    # tensor on the same storage (no Python reference to the payload tensor at all)
    if how == "view":
        held = a.shard[: NUMEL // 2]
    else:
        held = torch.empty(0).set_(a.shard.untyped_storage(), 0, (NUMEL // 2,))
    old = weakref.ref(a.shard)
    m.move(a, HOST)
    assert m._placement.spares.nbytes == 0  # not kept: freed with its last view
    m.move(b, ACC)
    assert b.shard is not old()
    m.move(b, HOST)
    assert torch.equal(held, torch.zeros(NUMEL // 2))  # p0 is 0.0: no move wrote into it
    assert torch.equal(b.view("p1"), torch.ones(NUMEL))


def test_disabled_spares_keep_nothing():
    m = _manager()
    m._placement.spares.enabled = False
    a = m.registry.param_chunks()[0]
    m.move(a, ACC)
    old = weakref.ref(a.shard)
    m.move(a, HOST)
    assert old() is None and m._placement.spares.nbytes == 0


@pytest.mark.parametrize(("spare_bytes", "kept"), [(SPARE_BYTES, 2), (0, 1)])
def test_small_payloads_keep_as_many_spares_as_fit_in_spare_bytes(spare_bytes, kept):
    """[Note: spare payloads]: two 1 KiB payloads freed before the next allocations (copies in
    flight settle later than their destinations are allocated) are both kept and both reused;
    with one spare per size the second is freed."""
    m = _manager()
    spares, host = m._placement.spares, m.books.tiers[HOST]
    spares.spare_bytes = spare_bytes
    first, second = torch.empty(NUMEL), torch.empty(NUMEL)
    ids = {id(first), id(second)}
    spares.give(first, host)
    del first
    spares.give(second, host)
    del second
    assert spares.nbytes == kept * 4 * NUMEL
    taken = [spares.take(NUMEL, torch.float32) for _ in range(2)]
    assert len(ids & {id(t) for t in taken if t is not None}) == kept
