"""Gemini's overlapped collectives ([Note: overlap]) on 2 gloo ranks: bit-identical to waiting
for each collective, and collectives really are in flight while operators compute."""

from __future__ import annotations

import _checks_overlap as checks
import pytest
import torch

from colossal_zero import GeminiConfig

CASES = {  # name -> (config, accumulation steps, clipping)
    "fp32 fits": (GeminiConfig(precision="fp32", chunk_numel=8192), 1, 0.0),
    "fp32 moves, accumulation, clipping": (
        GeminiConfig(precision="fp32", accelerator_bytes=220_000, chunk_numel=8192),
        2,
        0.5,
    ),
    "bf16 moves, accumulation": (  # masters: gradients in the parameter slots, stashed
        GeminiConfig(precision="bf16", accelerator_bytes=120_000, chunk_numel=8192),
        2,
        0.0,
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_overlapped_collectives_give_bit_identical_training(world, case):
    config, accum, clip = CASES[case]
    for on, off in world(2).run(checks.overlap_and_sync, config, 4, 8, accum, clip):
        assert on["losses"] == off["losses"]
        assert on["weights"].keys() == off["weights"].keys()
        for name, w in on["weights"].items():
            assert torch.equal(w, off["weights"][name]), name
        assert off["seen"] == 0 and off["most"] <= 1  # waiting: nothing outlives its call
        assert on["seen"] > 0, "no collective was in flight while an operator computed"
        assert on["most"] >= 2
        if config.accelerator_bytes is not None:
            assert on["moved"] > 0 and off["moved"] > 0


def test_gathers_several_ahead_are_fewer_collectives_same_bits(world):
    """[Note: gathers several ahead]: under a budget that shrinks chunks, gathering three chunks
    ahead starts fewer all-gather collectives per step than one ahead (coalesced), and trains to
    the same bits."""
    config = GeminiConfig(precision="fp32", accelerator_bytes=220_000, chunk_numel=8192)
    for out in world(2).run(checks.gathers_per_depth, config, (1, 3), 4, 8):
        one, three = out[1], out[3]
        assert one["losses"] == three["losses"]
        for name, w in one["weights"].items():
            assert torch.equal(w, three["weights"][name]), name
        assert 0 < three["gathers"] < one["gathers"], (three["gathers"], one["gathers"])
