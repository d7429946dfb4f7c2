"""Training under a host budget with most chunks and Adam states on disk: at every moment of
forward and backward and at every read-ahead of the optimizer step, host payloads plus the disk
bytes read ahead stay within the host budget ([Note: read-ahead window] in colossal-chunk), the
window is used (read-aheads happen and some are refused), and the losses are plain AdamW's.
And the gradient norm under a disk tier ([Note: norm on demand]): without clipping or a loss
scaler each chunk's squares are taken as its update set streams through memory, so gradients on
disk are read once per step; the norm equals the one computed up front (clipping on, a bound no
step reaches), which reads every gradient on disk once more, and plain PyTorch's. And fp32 parameter chunks evicted back to disk unchanged
within a forward or backward map their kept payload again instead of being written
(colossal-chunk's [Note: disk copies]): the same training bit for bit, fewer bytes written.
And the gradients the optimizer step only reads leave memory unwritten ([Note: reads let go])."""

import pytest
import torch
from _zero_model import adamw_losses

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


def _two_steps_of_adamw():
    """A batch, and plain AdamW's losses on it for 2 steps (seed 0)."""
    g = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, 256, (2, 2, 16), generator=g)
    torch.manual_seed(0)
    return x, y, adamw_losses(_gpt(), x, y, 2, lr=1e-3)


def _gemini(tmp_path, acc_shards: int, host_shards: int):
    """The GPT (seed 0) under Gemini with a disk tier in ``tmp_path``, and its optimizer."""
    torch.manual_seed(0)
    model = _gpt()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    config = GeminiConfig(
        device="cpu", chunk_numel=CHUNK, accelerator_bytes=acc_shards * SHARD,
        host_bytes=host_shards * SHARD, disk_bytes=None, disk_dir=tmp_path,
    )  # fmt: skip
    gm = apply_gemini(model, config, group=None)
    return gm, GeminiOptimizer.from_torch(gm, opt)


def test_host_payloads_and_pages_read_ahead_stay_within_the_host_budget(tmp_path):
    x, y, ref_losses = _two_steps_of_adamw()
    gm, gopt = _gemini(tmp_path, 6, 8)
    m = gm.runtime.manager
    window = m.shard_io.read_ahead_window
    assert window.window_bytes == 2 * SHARD  # the default: a quarter of the host budget
    host = m.books.tiers[TierName.HOST]
    checks, refused = [0], [0]

    def check() -> None:
        payloads = sum(c.shard_bytes for c in m.chunks.values() if c.tier is TierName.HOST)
        assert payloads + window.ahead_bytes <= host.capacity_bytes
        assert payloads <= host.capacity_bytes - window.window_bytes
        assert window.ahead_bytes <= window.window_bytes
        checks[0] += 1

    set_moment, read_ahead = m.set_moment, m.shard_io.read_ahead

    def spied_set_moment(*args, **kwargs):  # every moment of forward and backward
        set_moment(*args, **kwargs)
        check()

    def spied_read_ahead(chunks):  # every read-ahead, the optimizer's among them
        done = read_ahead(chunks)
        refused[0] += not done
        check()
        return done

    m.set_moment, m.shard_io.read_ahead = spied_set_moment, spied_read_ahead
    losses = []
    for _ in range(2):
        loss = gm(x, y)
        gopt.backward(loss)
        gopt.step()
        gopt.zero_grad()
        losses.append(loss.item())
    states = sum(c.shard_bytes for c in m.chunks.values())
    assert states >= 3 * host.capacity_bytes  # most of the model lives on disk
    assert checks[0] > 50 and refused[0] > 0 and window.peak_bytes == window.window_bytes
    assert m.books.stats().disk_io.bytes_read > 0
    m.close()
    torch.testing.assert_close(losses, ref_losses, rtol=1e-5, atol=1e-5)


def _train(tmp_path, max_grad_norm: float, x, y, *, keep: bool = True, acc_shards: int = 4):
    """3 steps under a disk tier (room for ``acc_shards`` shards on the compute tier); with
    ``keep`` off, every eviction to disk writes (as before [Note: disk copies]). Losses, gradient norms, bytes faulted in by each optimizer step, and
    after the run: the weights, the bytes written and the bytes moved back unwritten."""
    torch.manual_seed(0)
    model = _gpt()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    config = GeminiConfig(
        device="cpu", chunk_numel=CHUNK, accelerator_bytes=acc_shards * SHARD, host_bytes=4 * SHARD,
        disk_bytes=None, disk_dir=tmp_path, read_ahead_bytes=0,  # every disk read a fault-in
    )  # fmt: skip
    gm = apply_gemini(model, config, group=None)
    if not keep:
        gm.runtime._read_only_kinds = ()
    gopt = GeminiOptimizer.from_torch(gm, opt, max_grad_norm=max_grad_norm)
    m = gm.runtime.manager
    disk = m.books.tiers[TierName.DISK]
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
    disk.store.drain()  # type: ignore[union-attr]
    written = m.books.stats().disk_io.bytes_written  # type: ignore[union-attr]
    after = (gm.full_state_dict(), written, m.books.stats().disk_unwritten_bytes)
    m.close()
    return losses, norms, faulted, *after


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


def test_parameter_chunks_go_back_to_disk_unwritten_with_the_same_training(tmp_path):
    g = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, 256, (2, 2, 16), generator=g)
    torch.manual_seed(0)
    ref = adamw_losses(_gpt(), x, y, 3, lr=1e-3)
    # three shards of room: parameter chunks are evicted within forward and backward
    losses, _, _, weights, written, saved = _train(tmp_path / "kept", 0.0, x, y, acc_shards=3)
    plain = _train(tmp_path / "written", 0.0, x, y, keep=False, acc_shards=3)
    assert losses == plain[0]  # bit for bit
    assert weights.keys() == plain[3].keys()
    assert all(torch.equal(weights[k], plain[3][k]) for k in weights)
    torch.testing.assert_close(losses, ref, rtol=1e-5, atol=1e-5)
    assert plain[5] == 0 and saved > 0  # evictions to disk mapped their kept payload
    assert written + saved == plain[4]  # and wrote exactly that much less


def test_the_step_lets_gradients_on_disk_go_without_writing_them(tmp_path):
    # colossal-chunk's [Note: reads let go]: the update only reads a gradient (no clipping, no
    # loss scale), so its pages leave memory with nothing written; what the step writes are the
    # values and Adam states it updated
    x, y, ref = _two_steps_of_adamw()
    gm, gopt = _gemini(tmp_path, 4, 4)
    m = gm.runtime.manager
    store = m.books.tiers[TierName.DISK].store
    kinds, write_behind = [], store.write_behind  # type: ignore[union-attr]

    def spied(key, tensor):  # type: ignore[no-untyped-def]
        kinds.append(key.rsplit("-", 1)[0])
        write_behind(key, tensor)

    losses, grads_on_disk = [], 0
    for _ in range(2):
        loss = gm(x, y)
        gopt.backward(loss)
        grads_on_disk += sum(c.tier is TierName.DISK for c in m.chunks.values() if c.kind == "grad")
        store.write_behind = spied  # type: ignore[union-attr]
        gopt.step()
        store.write_behind = write_behind  # type: ignore[union-attr]
        gopt.zero_grad()
        losses.append(loss.item())
    m.close()
    assert grads_on_disk > 0  # the step read gradients off disk
    assert {"exp_avg", "exp_avg_sq", "param"} <= set(kinds) and "grad" not in kinds
    torch.testing.assert_close(losses, ref, rtol=1e-5, atol=1e-5)
