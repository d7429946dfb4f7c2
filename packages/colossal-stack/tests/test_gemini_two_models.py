"""Two Gemini models in one process, stepped alternately (as a benchmark pairs two methods):
each warmup's recorder closes while the other's may still be on the dispatch-mode stack
(colossal-memtrace's [Note: recorders of two runtimes]); both train like plain AdamW."""

from __future__ import annotations

import gc

import pytest
import torch
from _stack_reference import adamw_losses

from colossal import Booster, GeminiPlugin
from colossal.booster import GeminiConfig, parse_bytes
from colossal_models import GPT, GPTConfig

CFG = GPTConfig(vocab_size=256, max_seq_len=16, num_layers=2, num_heads=2, hidden_size=32)
STEPS = 3


def test_two_gemini_models_step_alternately_like_adamw(tmp_path):
    g = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, 256, (2, 16), generator=g), torch.randint(0, 256, (2, 16), generator=g)
    torch.manual_seed(0)
    ref_losses = adamw_losses(GPT(CFG), [(x, y)] * STEPS, 1e-3)
    gc.collect()
    runs = []
    for window in (None, 0):  # the default read-ahead window, and none
        torch.manual_seed(0)
        model = GPT(CFG)
        config = GeminiConfig(
            accelerator_bytes=512 << 10,
            host_bytes=128 << 10,
            disk_bytes=64 << 20,
            disk_dir=tmp_path,
            read_ahead_bytes=parse_bytes(window),
        )
        plugin = GeminiPlugin(config=config)
        booster = Booster(plugin)
        gm, opt = booster.boost(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
        runs.append((plugin, booster, gm, opt, []))
    for _ in range(STEPS):
        for plugin, booster, gm, opt, losses in runs:
            loss = gm(x, y)
            booster.backward(loss, opt)
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
            assert plugin.memory_stats()["disk_peak_bytes"] > 0
    for _, _, gm, _, losses in runs:
        assert losses == pytest.approx(ref_losses, abs=1e-5)
        gm.runtime.manager.close()
