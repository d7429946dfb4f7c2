"""Refactor guard for Gemini: a fixed-seed GPT-nano run under a budget that forces chunk moves must
reproduce the stored losses and final weights bit for bit (where the algorithm did not change),
and equal plain PyTorch AdamW within 1e-5 (fp32).

The stored fingerprint (``gemini_fingerprint.json`` beside this file) holds, per configuration, the
losses as exact float hex and a SHA-256 of every final weight. Regenerate it only when the
arithmetic changes on purpose: ``COLOSSAL_WRITE_FINGERPRINT=1 pytest this_file``.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import torch
from _reference import adamw_losses_and_weights, nano_gpt, token_batches
from _weights import assert_weights_close

from colossal_zero import GeminiConfig, GeminiOptimizer, apply_gemini

STEPS, BATCH, SEQ, LR = 10, 8, 32, 3e-3
FILE = Path(__file__).with_name("gemini_fingerprint.json")
# GPT-nano's fp32 parameters take ~0.6 MB; these budgets hold a fraction of them, so every step
# moves chunks between the (emulated) accelerator and the host.
CONFIGS = {
    "fp32-auto": GeminiConfig(precision="fp32", accelerator_bytes=400_000, chunk_numel=16384),
    "fp32-static": GeminiConfig(
        precision="fp32", placement="static", accelerator_bytes=400_000, chunk_numel=16384
    ),
    "bf16-auto": GeminiConfig(precision="bf16", accelerator_bytes=200_000, chunk_numel=16384),
}


@pytest.fixture
def one_thread():
    """One intra-op thread: CPU kernels then reduce in a fixed order, so bits are reproducible."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


_model = nano_gpt


def _data() -> list[tuple[torch.Tensor, torch.Tensor]]:
    return token_batches(STEPS, BATCH, SEQ, seed=7)


def _digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().float().contiguous().numpy().tobytes()).hexdigest()


def _gemini(config: GeminiConfig) -> tuple[list[float], dict[str, torch.Tensor], list[int]]:
    plain = _model()
    gm = apply_gemini(plain, config, group=None)
    opt = GeminiOptimizer.from_torch(gm, torch.optim.AdamW(plain.parameters(), lr=LR))
    losses, moved, last = [], [], 0
    for x, y in _data():
        loss = gm(x, y)
        opt.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
        total = gm.memory_stats().bytes_moved
        moved.append(total - last)
        last = total
    return losses, gm.full_state_dict(), moved


def _fingerprint(losses: list[float], weights: dict[str, torch.Tensor]) -> dict[str, object]:
    return {
        "losses": [float(v).hex() for v in losses],
        "weights": {k: _digest(v) for k, v in sorted(weights.items())},
    }


def test_gemini_fingerprint_is_unchanged_and_matches_adamw(one_thread):
    runs = {name: _gemini(cfg) for name, cfg in CONFIGS.items()}
    got = {name: _fingerprint(losses, weights) for name, (losses, weights, _) in runs.items()}
    if os.environ.get("COLOSSAL_WRITE_FINGERPRINT") == "1":
        FILE.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    stored = json.loads(FILE.read_text())
    for name in CONFIGS:
        assert all(m > 0 for m in runs[name][2]), f"{name}: a step moved no chunk"
        want = stored[name]
        assert got[name]["losses"] == want["losses"], f"{name}: losses changed"
        diff = [k for k in want["weights"] if got[name]["weights"].get(k) != want["weights"][k]]
        assert not diff, f"{name}: final weights changed: {diff[:4]}"
    ref_losses, ref_weights = adamw_losses_and_weights(_model(), _data(), LR)
    for name in ("fp32-auto", "fp32-static"):
        losses, weights, _ = runs[name]
        for i, (g, w) in enumerate(zip(losses, ref_losses, strict=True)):
            assert abs(g - w) <= 1e-5 * abs(w), f"{name} step {i}: {g} vs {w}"
        assert_weights_close(weights, ref_weights, rel=1e-5, key_atol=1e-3, label=f"{name}: ")
