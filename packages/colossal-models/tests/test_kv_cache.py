"""Incremental decoding through ``KVCache`` gives the logits of the full forward (fp32, within
1e-5; measured: up to 4e-7) for GPT, PaLM (parallel block, multi-query) and Llama-shaped PaLM
(grouped-query), whatever the split of the sequence into prompt and steps; the training forward
is untouched by it; a full cache and a position past the context are one-line errors."""

from __future__ import annotations

import pytest
import torch

from colossal_contracts import ConfigError
from colossal_models import GPT, GPTConfig, KVCache, PaLM, PaLMConfig

MODELS = {
    "gpt": lambda: GPT(GPTConfig.preset("nano")),
    "palm-mqa": lambda: PaLM(PaLMConfig.preset("nano")),
    "llama-gqa": lambda: PaLM(
        PaLMConfig.preset(
            "nano",
            num_heads=4,
            num_kv_heads=2,
            parallel_block=False,
            norm="rmsnorm",
            tie_embeddings=False,
        )
    ),
}


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("splits", [(20,), (7, 5, 1, 1, 6), (1,) * 20])
def test_cached_logits_equal_the_full_forward(name, splits):
    torch.manual_seed(0)
    model = MODELS[name]().eval()
    idx = torch.randint(0, 256, (2, 20))
    cache = KVCache(24)
    parts, start = [], 0
    with torch.no_grad():
        full = model(idx)
        for n in splits:
            parts.append(model(idx[:, start : start + n], cache=cache))
            start += n
    assert cache.length == 20
    torch.testing.assert_close(torch.cat(parts, dim=1), full, atol=1e-5, rtol=0)


def test_the_training_forward_does_not_touch_a_cache_and_is_unchanged():
    torch.manual_seed(0)
    model = MODELS["gpt"]()
    idx = torch.randint(0, 256, (2, 16))
    loss = model(idx, idx)
    loss.backward()  # the training path still has gradients
    assert model.wte.weight.grad is not None
    torch.manual_seed(0)
    again = MODELS["gpt"]()
    assert torch.equal(again(idx, idx), loss.detach())


def test_multi_query_caches_one_key_value_head():
    torch.manual_seed(0)
    mqa = MODELS["palm-mqa"]().eval()  # 2 query heads, 1 key/value head, head_dim 32
    cache = KVCache(10)
    with torch.no_grad():
        mqa(torch.zeros(1, 4, dtype=torch.long), cache=cache)
    layers, per_layer = mqa.config.num_layers, 2 * 1 * 1 * 10 * 32 * 4  # k+v, B, K, len, D, fp32
    assert cache.bytes() == layers * per_layer


def test_a_full_cache_and_a_position_past_the_context_are_errors():
    model = MODELS["gpt"]().eval()  # max_seq_len 64
    cache = KVCache(8)
    with torch.no_grad():
        model(torch.zeros(1, 6, dtype=torch.long), cache=cache)
        with pytest.raises(ConfigError, match="holds 8 positions") as err:
            model(torch.zeros(1, 3, dtype=torch.long), cache=cache)
        assert "\n" not in str(err.value)
        big = KVCache(100)
        model(torch.zeros(1, 64, dtype=torch.long), cache=big)
        with pytest.raises(ConfigError, match="past max_seq_len 64"):
            model(torch.zeros(1, 1, dtype=torch.long), cache=big)
