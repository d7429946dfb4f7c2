"""A float64 model computes in float64 end to end (losses are upcast to fp32 only from lower
precisions), which is what lets the parallel tests show exactness in double precision."""

from __future__ import annotations

import torch

from colossal_models import GPT, GPTConfig, PaLM, PaLMConfig


def test_float64_models_keep_float64_losses():
    torch.manual_seed(0)
    ids = torch.randint(0, 64, (2, 8))
    gpt = GPT(GPTConfig(vocab_size=64, max_seq_len=8, num_layers=1, num_heads=2, hidden_size=16))
    palm = PaLM(PaLMConfig(vocab_size=64, max_seq_len=8, num_layers=1, num_heads=2, hidden_size=16))
    for model in (gpt, palm):
        model64 = model.to(torch.float64)
        loss = model64(ids, ids)
        assert loss.dtype == torch.float64
        with torch.no_grad():
            logits = model64(ids)
        want = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids.flatten())
        assert abs(float(loss) - float(want)) <= 1e-14 * float(want)
