"""Lazy initialization: models built inside LazyInit hold no memory, materialize bit for bit as
eager construction under the same seed (GPT, PaLM, a Hugging Face GPT-2 from a config), leave the
random generator where eager construction leaves it, and train under Gemini exactly as the eager
model does."""

import pytest
import torch

from colossal_contracts import ConfigError
from colossal_zero import GeminiConfig, GeminiOptimizer, LazyInit, apply_gemini


def _gpt():
    # colossal-zero does not depend on colossal-models: alone, these cases skip
    models = pytest.importorskip("colossal_models")
    GPT, GPTConfig = models.GPT, models.GPTConfig
    return GPT(GPTConfig(vocab_size=256, max_seq_len=32, num_layers=2, num_heads=2, hidden_size=64))


def _palm():
    models = pytest.importorskip("colossal_models")
    PaLM, PaLMConfig = models.PaLM, models.PaLMConfig

    return PaLM(PaLMConfig.preset("nano"))


def _gpt2():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(
        n_layer=2, n_embd=64, n_head=2, vocab_size=256, n_positions=32, bos_token_id=0,
        eos_token_id=0,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(cfg)


@pytest.mark.parametrize("build", [_gpt, _palm, _gpt2], ids=["gpt", "palm", "hf-gpt2"])
def test_lazy_init_equals_eager_bit_for_bit(build):
    torch.manual_seed(0)
    eager = build()
    rng_after = torch.get_rng_state()
    torch.manual_seed(0)
    with LazyInit() as lazy:
        model = build()
    assert torch.equal(torch.get_rng_state(), rng_after)  # later randomness is unchanged too
    want = eager.state_dict()
    got = model.state_dict(keep_vars=True)
    assert got.keys() == want.keys()
    for name, t in got.items():
        assert t.is_meta, name
        value = lazy.materialize(t)
        assert value.dtype == want[name].dtype and torch.equal(value, want[name]), name


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_gemini_from_lazy_init_trains_like_eager(precision):
    g = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, 256, (2, 2, 32), generator=g)
    runs = []
    for lazy_mode in (False, True):
        torch.manual_seed(0)
        lazy = LazyInit() if lazy_mode else None
        if lazy is not None:
            with lazy:
                model = _gpt()
        else:
            model = _gpt()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        gm = apply_gemini(
            model, GeminiConfig(precision=precision, device="cpu"), group=None, lazy=lazy
        )
        gopt = GeminiOptimizer.from_torch(gm, opt)
        losses = []
        for _ in range(3):
            loss = gm(x, y)
            gopt.backward(loss)
            gopt.step()
            gopt.zero_grad()
            losses.append(loss.item())
        runs.append((losses, gm.full_state_dict()))
    (a, sa), (b, sb) = runs
    assert a == b
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


def test_meta_model_without_its_lazy_context_is_a_config_error():
    with torch.device("meta"):
        model = _gpt()
    with pytest.raises(ConfigError, match="lazy_init"):
        apply_gemini(model, GeminiConfig(device="cpu"), group=None)
