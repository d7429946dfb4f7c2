"""Reduced gradients land where the optimizer reads them (2 gloo ranks, fp32, a budget that moves
chunks): a chunk whose Adam states live on the host takes its reduce-scatter result in its host
gradient shard, instead of bringing that shard to the compute tier and evicting it again; the
training is bit-identical to the one that brought it in."""

from __future__ import annotations

import _checks_grad_home as checks
import torch

from colossal_zero import GeminiConfig


def test_gradients_read_on_the_host_stay_there(world):
    # the default state placement ("free"): planned after a measured step, no room for states
    cfg = GeminiConfig(precision="fp32", accelerator_bytes=220_000, chunk_numel=8192)
    for on, off in world(2).run(checks.grad_homes, cfg, 4, 8):
        assert on["losses"] == off["losses"]
        for name, w in on["weights"].items():
            assert torch.equal(w, off["weights"][name]), name
        assert off["grad_moves"], "the budget brought no gradient shard in: the check is empty"
        assert on["states_on_acc"] == 0  # the budget leaves no room for states
        assert on["grad_moves"] == [], on["grad_moves"]
        assert on["moved"] < off["moved"]
