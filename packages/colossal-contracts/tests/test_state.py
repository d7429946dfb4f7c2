import itertools

import pytest

from colossal_contracts import (
    LEGAL_TRANSITIONS,
    ConfigError,
    StateTransitionError,
    TensorState,
    check_transition,
)


def test_every_state_has_a_row():
    assert set(LEGAL_TRANSITIONS) == set(TensorState)


@pytest.mark.parametrize("old,new", list(itertools.product(TensorState, TensorState)))
def test_transitions_follow_the_table(old, new):
    if old is new or new in LEGAL_TRANSITIONS[old]:
        check_transition(old, new)
    else:
        with pytest.raises(StateTransitionError, match=f"{old.name} -> {new.name}"):
            check_transition(old, new, what="w")


def test_a_training_step_is_a_legal_walk():
    walk = [
        "FREE",
        "HOLD",
        "COMPUTE",
        "HOLD",
        "COMPUTE",
        "READY_FOR_REDUCE",
        "HOLD",
        "FREE",
    ]
    for a, b in itertools.pairwise(walk):
        check_transition(TensorState[a], TensorState[b])


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)
