import pytest
import torch

from colossal_chunk import Chunk
from colossal_contracts import ChunkStateError, ConfigError, StateTransitionError, TensorState


def _filled(capacity=16, shapes=((2, 3), (4,), (5,))):
    c = Chunk(0, capacity, torch.float32)
    tensors = {}
    for i, s in enumerate(shapes):
        c.add(f"t{i}", s)
        tensors[f"t{i}"] = torch.arange(torch.Size(s).numel(), dtype=torch.float32).view(s) + 10 * i
    c.fill_shard(torch.empty(c.shard_numel), tensors)
    return c, tensors


def test_tensors_are_views_at_their_offsets():
    c, tensors = _filled()
    assert [r.offset for r in c] == [0, 6, 10]
    assert c.used == 15 and c.padding == 1
    for name, t in tensors.items():
        v = c.view(name)
        assert torch.equal(v, t)
        assert v.data_ptr() == c.full.data_ptr() + c.records[name].offset * 4
    assert c.full[15] == 0  # padding is zeroed


def test_a_tensor_that_does_not_fit_names_the_fix():
    c = Chunk(0, 8, torch.float32)
    c.add("a", (6,))
    with pytest.raises(ConfigError, match="raise chunk_numel to at least 4"):
        c.add("b", (4,))


def test_parallel_chunk_has_the_same_layout():
    c, _ = _filled()
    twin = c.same_layout(1, torch.bfloat16, "grad")
    assert [(r.name, r.offset, r.shape) for r in twin] == [(r.name, r.offset, r.shape) for r in c]
    assert twin.dtype is torch.bfloat16 and twin.kind == "grad"


def test_states_follow_the_table_and_pin_the_chunk():
    c, _ = _filled()
    assert all(r.state is TensorState.HOLD for r in c)  # one rank: payload always present
    c.set_state("t0", TensorState.COMPUTE)
    assert c.pinned and not c.movable
    with pytest.raises(StateTransitionError, match="COMPUTE -> FREE"):
        c.set_state("t0", TensorState.FREE)
    c.set_state("t0", TensorState.READY_FOR_REDUCE)
    assert not c.pinned and not c.movable
    with pytest.raises(StateTransitionError, match="READY_FOR_REDUCE"):
        c.reduce_scatter()
    for name in c.records:
        if c.state(name) is TensorState.HOLD:
            c.set_state(name, TensorState.COMPUTE)
        c.set_state(name, TensorState.READY_FOR_REDUCE)
    assert c.reduce_scatter() is None  # one rank: nothing to communicate
    assert all(r.state is TensorState.HOLD for r in c)


def test_capacity_must_divide_among_ranks():
    with pytest.raises(ConfigError, match="multiple"):
        Chunk(0, 0, torch.float32)


def test_storage_accessors_name_a_chunk_without_storage():
    c = Chunk(3, 8, torch.float32)
    c.add("w", (4,))
    for read in (lambda: c.payload, lambda: c.current_tier, lambda: c.shard_part("w")):
        with pytest.raises(ChunkStateError, match="chunk 3"):
            read()
    c.fill_shard(torch.empty(c.shard_numel), {"w": torch.ones(4)})
    assert c.payload is c.shard and torch.equal(c.shard_part("w"), torch.ones(4))
