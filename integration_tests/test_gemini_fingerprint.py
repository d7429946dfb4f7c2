"""Refactor guard for Gemini: a fixed-seed GPT-nano run under a budget that forces chunk moves must
reproduce the stored losses and final weights bit for bit (where the algorithm did not change),
and equal plain PyTorch AdamW within 1e-5 (fp32).

The stored fingerprint (``gemini_fingerprint.json`` beside this file) holds, per configuration, the
losses as exact float hex and a SHA-256 of every final weight. Regenerate it only when the
arithmetic changes on purpose: ``COLOSSAL_WRITE_FINGERPRINT=1 pytest this_file``.

[Note: pinned kernels] Bits depend on the CPU: ATen, MKL and oneDNN choose their kernels by
instruction set (AVX2, AVX-512) and vendor, so one run differs in its last bits between machines.
The runs therefore happen in a child process with one thread and every library pinned to its AVX2
kernels (``PINNED``), which any x86-64 CPU of the last decade runs. The stored fingerprint, made on
an AVX2 machine, is reproduced bit for bit on an AVX-512 AMD EPYC with the pins; without them that
machine changes 1 loss in 10 (fp32) and 9 in 10 (bf16). Elsewhere (not x86-64) only the comparison
with AdamW is made.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

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


# the child's environment: AVX2 kernels in ATen, MKL and oneDNN, one thread (see the note)
PINNED = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_CBWR": "AVX2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "OMP_NUM_THREADS": "1",
}
X86_64 = platform.machine().lower() in ("x86_64", "amd64")


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


def _pinned_runs(out: Path) -> dict[str, tuple[list[float], dict[str, torch.Tensor], list[int]]]:
    """Every configuration run in a child process under ``PINNED`` (see [Note: pinned kernels])."""
    env = {**os.environ, **PINNED}
    subprocess.run([sys.executable, __file__, str(out)], env=env, check=True)
    return torch.load(out, weights_only=True)


def test_gemini_fingerprint_is_unchanged_and_matches_adamw(tmp_path):
    runs = _pinned_runs(tmp_path / "runs.pt")
    for name in CONFIGS:
        assert all(m > 0 for m in runs[name][2]), f"{name}: a step moved no chunk"
    got = {name: _fingerprint(losses, weights) for name, (losses, weights, _) in runs.items()}
    if X86_64 and os.environ.get("COLOSSAL_WRITE_FINGERPRINT") == "1":
        FILE.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    stored = json.loads(FILE.read_text())
    for name in CONFIGS if X86_64 else ():
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


if __name__ == "__main__":  # the child of _pinned_runs: argv[1] is where its runs go
    torch.set_num_threads(1)
    torch.save({name: _gemini(cfg) for name, cfg in CONFIGS.items()}, sys.argv[1])
