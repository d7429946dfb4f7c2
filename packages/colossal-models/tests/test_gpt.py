import pytest
import torch

from colossal_contracts import ConfigError
from colossal_models import GPT, GPT_PRESETS, GPTConfig


@pytest.mark.parametrize("name", list(GPT_PRESETS))
def test_num_params_matches_the_module(name):
    cfg = GPTConfig.preset(name)
    with torch.device("meta"):
        model = GPT(cfg)
    assert sum(p.numel() for p in model.parameters()) == cfg.num_params()


def test_published_sizes():
    assert round(GPTConfig.preset("small").num_params() / 1e6) == 124
    assert round(GPTConfig.preset("175b").num_params() / 1e9) == 175


def test_unknown_preset_names_the_choices():
    with pytest.raises(ConfigError, match=r"unknown GPT preset 'huge'.*tiny"):
        GPTConfig.preset("huge")


def test_heads_must_divide_width():
    with pytest.raises(ConfigError, match="not divisible"):
        GPTConfig(hidden_size=100, num_heads=3)


def test_embeddings_are_tied_and_shapes_right():
    cfg = GPTConfig.preset("nano")
    model = GPT(cfg)
    idx = torch.randint(0, cfg.vocab_size, (3, 10))
    logits = model(idx)
    assert logits.shape == (3, 10, cfg.vocab_size)
    loss = model(idx, idx)
    loss.backward()
    # the tied head gives wte gradient from both ends: rows of unseen tokens still get gradient
    unseen = torch.ones(cfg.vocab_size, dtype=torch.bool)
    unseen[idx.unique()] = False
    assert model.wte.weight.grad[unseen].abs().sum() > 0


def test_causality_future_tokens_do_not_change_the_past():
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("nano")).eval()
    a = torch.randint(0, 256, (1, 16))
    b = a.clone()
    b[0, 8:] = (b[0, 8:] + 1) % 256
    torch.testing.assert_close(model(a)[:, :8], model(b)[:, :8])


def test_initial_loss_is_near_uniform():
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("micro"))
    idx, targets = torch.randint(0, 256, (2, 4, 64))
    assert abs(model(idx, targets).item() - torch.log(torch.tensor(256.0)).item()) < 0.3


def test_too_long_input_is_a_clear_error():
    model = GPT(GPTConfig.preset("nano"))
    with pytest.raises(ConfigError, match="exceeds max_seq_len 64"):
        model(torch.zeros(1, 65, dtype=torch.long))
