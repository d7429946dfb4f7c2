"""3D layers on an 8-rank q=2 cube, in both activation layouts: values, gradients, counted
bytes, errors, training.

Every check of the mode runs inside one ``world(8).run`` call (spawning ranks is the slow part);
the tests below assert on its results.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import _checks_tp_multid as checks
from _tp_multid_asserts import assert_layers, assert_training

MODE, RANKS = "3d", 8


@pytest.fixture(scope="module")
def layer_results(world):
    return world(RANKS).run(checks.run_layers, MODE)


@pytest.fixture(scope="module")
def training_results(world):
    return world(RANKS).run(checks.run_training, MODE)


def test_layers_match_unsharded_reference(layer_results):
    assert_layers(layer_results, "errors")


def test_counted_bytes_equal_formulas(layer_results):
    assert_layers(layer_results, "bytes")


def test_invalid_sizes_raise_before_any_collective(layer_results):
    assert_layers(layer_results, "config")


def test_two_block_transformer_trains_like_single_process(training_results):
    assert_training(training_results)
