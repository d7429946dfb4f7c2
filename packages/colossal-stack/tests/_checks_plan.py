"""Rank-side runs for test_plan's validation against measured bytes (run inside a ``World``)."""

from __future__ import annotations

import torch

from colossal_models import GPT, GPTConfig
from colossal_zero import LowLevelZeroOptimizer, ZeroConfig


def zero_state_bytes(stage: int, preset: str = "micro") -> tuple[int, int]:
    """Parameters of ``preset``, and the model-state bytes this rank holds after one bf16 ZeRO
    step."""
    torch.manual_seed(0)
    cfg = GPTConfig.preset(preset)
    model = GPT(cfg)
    opt = LowLevelZeroOptimizer(
        model, model.parameters(), lr=1e-3, config=ZeroConfig(stage=stage, precision="bf16")
    )
    ids = torch.randint(0, cfg.vocab_size, (2, 32))
    opt.backward(model(ids, ids))
    opt.step()
    opt.zero_grad()
    return cfg.num_params(), sum(opt.model_state_bytes().values())
