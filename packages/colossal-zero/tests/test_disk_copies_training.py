"""Training with fp32 parameter chunks on disk keeps their disk payloads within each forward and
backward (colossal-chunk's [Note: disk copies]): a chunk evicted back to disk unchanged maps its
payload again instead of writing it. Losses and weights are bit-identical to the run that writes
them every time, and plain AdamW's; the disk tier writes fewer bytes."""

import pytest
import torch
from _zero_model import adamw_losses

from colossal_contracts import TierName
from colossal_zero import GeminiConfig, GeminiOptimizer, apply_gemini

CHUNK = 8192  # elements: a 32 KiB fp32 shard
SHARD = CHUNK * 4
STEPS = 3


def _gpt():
    models = pytest.importorskip("colossal_models")  # colossal-zero does not depend on it
    cfg = models.GPTConfig(
        vocab_size=256, max_seq_len=16, num_layers=2, num_heads=2, hidden_size=32
    )
    return models.GPT(cfg)


def _train(tmp_path, x, y, *, keep: bool):
    torch.manual_seed(0)
    model = _gpt()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    config = GeminiConfig(
        device="cpu", chunk_numel=CHUNK, accelerator_bytes=4 * SHARD, host_bytes=4 * SHARD,
        disk_bytes=None, disk_dir=tmp_path,
    )  # fmt: skip
    gm = apply_gemini(model, config, group=None)
    if not keep:
        gm.runtime._read_only_kinds = ()  # every eviction to disk writes, as before the note
    gopt = GeminiOptimizer.from_torch(gm, opt)
    m = gm.runtime.manager
    losses = []
    for _ in range(STEPS):
        loss = gm(x, y)
        gopt.backward(loss)
        gopt.step()
        gopt.zero_grad()
        losses.append(loss.item())
    m.tiers[TierName.DISK].store.drain()  # type: ignore[union-attr]
    written = m.stats().disk_io.bytes_written  # type: ignore[union-attr]
    weights = gm.full_state_dict()
    saved = m.disk_writes_saved
    m.close()
    return losses, weights, written, saved


def test_parameter_chunks_go_back_to_disk_unwritten_with_the_same_training(tmp_path):
    g = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, 256, (2, 2, 16), generator=g)
    torch.manual_seed(0)
    ref = adamw_losses(_gpt(), x, y, STEPS, lr=1e-3)
    kept = _train(tmp_path / "kept", x, y, keep=True)
    plain = _train(tmp_path / "written", x, y, keep=False)
    assert kept[0] == plain[0]  # losses, bit for bit
    assert kept[1].keys() == plain[1].keys()
    assert all(torch.equal(kept[1][k], plain[1][k]) for k in kept[1])
    torch.testing.assert_close(kept[0], ref, rtol=1e-5, atol=1e-5)
    assert plain[3] == 0 and kept[3] > 0  # evictions to disk mapped their kept payload
    assert kept[2] + kept[3] == plain[2]  # and wrote exactly that much less
