"""The CUDA path: real accelerator tier, pinned host chunks, side-stream prefetch. Skipped
without a GPU."""

from __future__ import annotations

import _checks_update as cu
import _checks_zero as checks
import pytest
import torch
from _zero_model import reference
from test_gemini import assert_losses_close, rel_err

from colossal_contracts import TierName
from colossal_zero import GeminiConfig

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_cuda_fp32_with_prefetch_matches_adamw_and_pins_host_chunks():
    cfg = GeminiConfig(
        precision="fp32", device="cuda", accelerator_bytes=160_000, chunk_numel=8192, prefetch=2
    )
    model, opt = checks.make(cfg)
    assert model.runtime.manager.books.tiers[TierName.HOST].pin_memory
    assert model.compute_device.type == "cuda"
    losses = checks.train(model, opt, 10, 8)
    ref_losses, ref_weights = reference(10, 8)
    assert_losses_close(losses, ref_losses, 1e-4)
    assert rel_err(model.full_state_dict(), ref_weights) <= 1e-4


def test_cuda_bf16_trains():
    cfg = GeminiConfig(precision="bf16", device="cuda", accelerator_bytes=60_000, chunk_numel=8192)
    model, opt = checks.make(cfg)
    losses = checks.train(model, opt, 10, 8)
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_cuda_update_in_backward_equals_the_unfused_step(tmp_path, precision):
    # [Note: update in backward] with a disk tier, the compute tier on the GPU
    args = (6, 8)
    fused = cu.run(str(tmp_path / "fused"), precision, None, *args, accum=2, device="cuda")
    unfused = cu.run(str(tmp_path / "unfused"), precision, False, *args, accum=2, device="cuda")
    assert fused[0] == unfused[0] and fused[5] == unfused[5]
    assert all(torch.equal(fused[1][k], unfused[1][k]) for k in unfused[1])
    assert fused[2][-1] > 0 and sum(unfused[2]) == 0
    print(
        f"{precision}: disk bytes written per step {fused[3]} vs {unfused[3]}, read {fused[4]} vs {unfused[4]}"
    )
