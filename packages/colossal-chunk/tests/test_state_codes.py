"""[Note: states by number]: the coded table and counters say what the enum's table says."""

import pytest
import torch

from colossal_chunk import Chunk
from colossal_chunk._records import LEGAL, STATES, code_of
from colossal_contracts import LEGAL_TRANSITIONS, StateTransitionError, TensorState


def test_table_is_legal_transitions():
    for old in TensorState:
        for new in TensorState:
            want = old is new or new in LEGAL_TRANSITIONS[old]
            assert LEGAL[code_of(old)][code_of(new)] is want, (old, new)
    assert [code_of(s) for s in STATES] == list(range(len(TensorState)))
    with pytest.raises(TypeError, match="TensorState"):
        code_of("hold")  # type: ignore[arg-type]


def test_counters_follow_every_transition_and_illegal_ones_raise():
    chunk = Chunk(0, 8, torch.float32)
    for name in "abc":
        chunk.add(name, (2,))
    walk = [
        ("a", TensorState.COMPUTE),
        ("b", TensorState.COMPUTE),
        ("a", TensorState.READY_FOR_REDUCE),
        ("b", TensorState.HOLD),
        ("c", TensorState.FREE),
        ("a", TensorState.HOLD),
    ]
    for name, new in walk:
        chunk.set_state(name, new)
        assert chunk.state(name) is new and chunk.records[name].state is new
        for s in TensorState:
            assert chunk.count(s) == sum(r.state is s for r in chunk)
            assert chunk.all_in(s) == all(r.state is s for r in chunk)
        assert chunk.pinned == any(r.state is TensorState.COMPUTE for r in chunk)
        assert chunk.movable == all(r.state in (TensorState.HOLD, TensorState.FREE) for r in chunk)
    with pytest.raises(
        StateTransitionError,
        match=r"tensor .c. of chunk 0: illegal state transition FREE -> COMPUTE",
    ):
        chunk.set_state("c", TensorState.COMPUTE)
    assert chunk.state("c") is TensorState.FREE and chunk.count(TensorState.COMPUTE) == 0
