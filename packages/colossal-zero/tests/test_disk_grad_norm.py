"""The gradient norm under a disk tier ([Note: norm on demand]): without clipping or a loss
scaler each chunk's squares are taken as its update set streams through memory, so gradients on
disk are read once per step; the norm equals the one computed up front (clipping on, a bound no
step reaches), which reads every gradient on disk once more, and plain PyTorch's."""

import pytest
import torch

from colossal_contracts import TierName
from colossal_zero import GeminiConfig, GeminiOptimizer, apply_gemini

CHUNK = 8192  # elements: a 32 KiB fp32 shard
SHARD = CHUNK * 4


def _gpt():
    models = pytest.importorskip("colossal_models")  # colossal-zero does not depend on it
    cfg = models.GPTConfig(
        vocab_size=256, max_seq_len=16, num_layers=2, num_heads=2, hidden_size=32
    )
    return models.GPT(cfg)


def _train(tmp_path, max_grad_norm: float, x, y):
    torch.manual_seed(0)
    model = _gpt()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    config = GeminiConfig(
        device="cpu", chunk_numel=CHUNK, accelerator_bytes=4 * SHARD, host_bytes=4 * SHARD,
        disk_bytes=None, disk_dir=tmp_path, read_ahead_bytes=0,  # every disk read a fault-in
    )  # fmt: skip
    gm = apply_gemini(model, config, group=None)
    gopt = GeminiOptimizer.from_torch(gm, opt, max_grad_norm=max_grad_norm)
    disk = gm.runtime.manager.tiers[TierName.DISK]
    losses, norms, faulted = [], [], []
    for _ in range(3):
        loss = gm(x, y)
        gopt.backward(loss)
        before = disk.faulted_bytes
        gopt.step()
        faulted.append(disk.faulted_bytes - before)  # the step's reads off disk
        norms.append(gopt.last_grad_norm)
        gopt.zero_grad()
        losses.append(loss.item())
    gm.runtime.manager.close()
    return losses, norms, faulted


def test_gradients_on_disk_are_read_once_per_step_for_the_update_and_the_norm(tmp_path):
    g = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, 256, (2, 2, 16), generator=g)
    torch.manual_seed(0)
    ref = _gpt()
    ref_norms = []
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    for _ in range(3):
        ref(x, y).backward()
        ref_norms.append(torch.nn.utils.clip_grad_norm_(ref.parameters(), 1e9).item())
        opt.step()
        opt.zero_grad()
    streamed = _train(tmp_path / "streamed", 0.0, x, y)
    up_front = _train(tmp_path / "up-front", 1e9, x, y)
    assert streamed[0] == up_front[0]  # the same training, bit for bit
    assert streamed[1] == up_front[1]  # the same norm, taken later
    torch.testing.assert_close(streamed[1], ref_norms, rtol=1e-5, atol=1e-7)
    assert all(s < u for s, u in zip(streamed[2], up_front[2], strict=True))  # grads on disk
