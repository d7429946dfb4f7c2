"""Ring attention (zigzag and contiguous layouts) and Ulysses at sp = 2 and 4: output and input
gradients equal full causal attention within 1e-5; counted bytes equal the formulas; bad shapes
raise ConfigError before any collective. Layout positions are checked without processes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from colossal_contracts import ConfigError
from colossal_parallel.sequence import sequence_positions

sys.path.insert(0, str(Path(__file__).parent))
import _checks_long_seq as checks

TOL = 1e-5


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("sp", [1, 2, 4])
def test_layouts_cover_the_sequence_once(layout, sp):
    got = torch.cat([sequence_positions(16, sp, r, layout) for r in range(sp)])
    assert sorted(got.tolist()) == list(range(16))


def test_zigzag_pairs_an_early_and_a_late_chunk():
    assert sequence_positions(8, 2, 0, "zigzag").tolist() == [0, 1, 6, 7]
    assert sequence_positions(8, 2, 1, "zigzag").tolist() == [2, 3, 4, 5]
    with pytest.raises(ConfigError, match="multiple of 4"):
        sequence_positions(6, 2, 0, "zigzag")


@pytest.mark.parametrize("sp", [2, 4])
def test_distributed_attention_equals_full_causal_attention(world, sp):
    results = world(sp).run(checks.attention_cases)
    for rank, res in enumerate(results):
        assert set(res) == set(checks.METHODS)
        for name, r in res.items():
            assert r["out_err"] <= TOL, (rank, name, r["out_err"])
            assert r["grad_err"] <= TOL, (rank, name, r["grad_err"])
            assert r["bytes"] == r["formula"], (rank, name, r["bytes"], r["formula"])
            assert r["bytes"][0] > 0
            if name.startswith("ring"):
                assert r["sends"] == r["recvs"] > 0


def test_bad_shapes_raise_before_any_collective(world):
    for res in world(2).run(checks.attention_errors):
        assert len(res) == 4
        for name, msg in res.items():
            assert msg.startswith("ok (0 collectives)"), (name, msg)
