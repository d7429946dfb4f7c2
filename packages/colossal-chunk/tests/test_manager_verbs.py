"""The manager's facade: a dozen verbs over the parts it holds (registry, residency, collectives,
books, shard I/O), and the keyword forms that replaced separate verbs (``access``/``release`` of
whole chunks, ``release(twin=)``, ``settle(reshard=)``, ``move(keep=)``)."""

import inspect

import pytest
import torch
from torch import nn

from colossal_chunk import ChunkConfig, ChunkManager
from colossal_contracts import ConfigError, TensorState, TierName

ACC, HOST = TierName.ACCELERATOR, TierName.HOST
NUMEL = 256  # one parameter per chunk: 1 KiB in fp32
VERBS = {
    "register", "add_parallel", "repack", "set_moment", "access", "release", "reduce",
    "gather_ahead", "settle", "move", "chunk_of", "close",
}  # fmt: skip
RECORDS = {"chunks", "groups", "config"}


def _manager() -> tuple[ChunkManager, list[str]]:
    params = [(f"p{i}", nn.Parameter(torch.full((NUMEL,), float(i)))) for i in range(3)]
    cfg = ChunkConfig(NUMEL, host_bytes=None, device="cpu", disk_bytes=0, home="host")
    m = ChunkManager(cfg)
    m.register(params)
    return m, [n for n, _ in params]


def test_the_facade_is_its_verbs_and_records_and_inherits_from_no_mixin():
    public = {
        n
        for n, v in inspect.getmembers(ChunkManager)
        if not n.startswith("_") and (callable(v) or isinstance(v, property))
    }
    assert public == VERBS | RECORDS
    assert ChunkManager.__mro__[1:] == (object,)


def test_whole_chunks_are_accessed_and_released_through_the_same_verbs():
    m, names = _manager()
    grads = m.add_parallel("grad", torch.float32)
    m.access([grads[0]], zero=True)
    assert grads[0].all_in(TensorState.COMPUTE) and grads[0].tier is ACC
    m.release([grads[0]], state=TensorState.READY_FOR_REDUCE)
    assert grads[0].all_in(TensorState.READY_FOR_REDUCE)
    with pytest.raises(ConfigError, match="takes chunks"):
        m.access(names[:1], zero=True)


def test_release_of_a_twin_moves_only_the_named_tensors_of_that_twin():
    m, names = _manager()
    grads = m.add_parallel("grad", torch.float32)
    m.access([grads[1]], discard=True)
    m.release([names[1]], state=TensorState.READY_FOR_REDUCE, twin="grad")
    assert grads[1].state(names[1]) is TensorState.READY_FOR_REDUCE
    assert m.chunk_of(names[1]).state(names[1]) is not TensorState.READY_FOR_REDUCE
    with pytest.raises(ConfigError, match="not chunks"):
        m.release([grads[1]], twin="grad")


def test_move_keeps_a_chunk_on_the_compute_tier_when_asked():
    m, _ = _manager()
    states = m.add_parallel("state", torch.float32)
    m.move(states[0], ACC, keep=True)
    assert states[0].tier is ACC and states[0].kept
    assert m.books.kept_bytes() == states[0].shard_bytes
    with pytest.raises(ConfigError, match="compute tier"):
        m.move(states[1], HOST, keep=True)


def test_settle_with_reshard_needs_the_chunks():
    m, names = _manager()
    c = m.chunk_of(names[0])
    m.settle([c], reshard=True)  # one rank: nothing gathered to drop; states end HOLD
    assert c.all_in(TensorState.HOLD) or c.all_in(TensorState.FREE)
    with pytest.raises(ConfigError, match="takes the chunks"):
        m.settle(reshard=True)
