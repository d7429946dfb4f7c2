import math

import pytest
import torch

from colossal_contracts import ConfigError
from colossal_models import PALM_PRESETS, PaLM, PaLMConfig, apply_activation_checkpointing


@pytest.mark.parametrize("name", list(PALM_PRESETS))
def test_num_params_matches_the_module(name):
    cfg = PaLMConfig.preset(name)
    with torch.device("meta"):
        model = PaLM(cfg)
    assert sum(p.numel() for p in model.parameters()) == cfg.num_params()


def test_published_sizes():
    # PaLM table 1 (8.63B, 62.50B, 540.35B) and Llama 2 7B (6.74B).
    assert round(PaLMConfig.preset("palm-8b").num_params() / 1e7) == 863
    assert round(PaLMConfig.preset("palm-62b").num_params() / 1e8) == 625
    assert round(PaLMConfig.preset("palm-540b").num_params() / 1e8) == 5404
    assert round(PaLMConfig.preset("llama-7b").num_params() / 1e7) == 674


def test_palm_block_is_parallel_multi_query_and_bias_free():
    model = PaLM(PaLMConfig.preset("nano"))
    block = model.blocks[0]
    assert block.ln2 is None  # one norm feeds attention and MLP
    assert block.attn.k.weight.shape == (32, 64)  # one key head of width 32
    assert all(not n.endswith("bias") for n, _ in model.named_parameters())
    assert model.lm_head is None and model.output_weight is model.wte.weight


def test_config_errors_name_the_fix():
    with pytest.raises(ConfigError, match="must divide num_heads"):
        PaLMConfig(num_heads=4, num_kv_heads=3)
    with pytest.raises(ConfigError, match="set head_dim"):
        PaLMConfig(hidden_size=100, num_heads=3)
    with pytest.raises(ConfigError, match="even head_dim"):
        PaLMConfig(hidden_size=96, num_heads=32)
    with pytest.raises(ConfigError, match=r"unknown PaLM preset 'x'.*palm-540b"):
        PaLMConfig.preset("x")


@pytest.mark.parametrize(
    "overrides",
    [{}, {"parallel_block": False, "norm": "rmsnorm", "tie_embeddings": False, "num_kv_heads": 2}],
)
def test_causal_and_shapes(overrides):
    torch.manual_seed(0)
    model = PaLM(PaLMConfig.preset("nano", **overrides)).eval()
    a = torch.randint(0, 256, (2, 16))
    b = a.clone()
    b[:, 8:] = (b[:, 8:] + 1) % 256
    la, lb = model(a), model(b)
    assert la.shape == (2, 16, 256)
    torch.testing.assert_close(la[:, :8], lb[:, :8])
    assert not torch.allclose(la[:, 8:], lb[:, 8:])


def test_rotary_makes_attention_depend_on_relative_position():
    # Without a position table, only rotary positions can tell the order: shifting a sequence
    # of identical tokens into a longer window changes nothing for the relative pattern, but
    # reversing distinct tokens changes the last logits.
    torch.manual_seed(0)
    model = PaLM(PaLMConfig.preset("nano")).eval()
    x = torch.randint(0, 256, (1, 12))
    assert not torch.allclose(model(x)[:, -1], model(x.flip(1))[:, -1])


def test_grouped_query_attention_equals_repeated_heads():
    torch.manual_seed(0)
    gqa = PaLM(PaLMConfig.preset("nano", num_heads=4, num_kv_heads=2, hidden_size=64))
    mha = PaLM(PaLMConfig.preset("nano", num_heads=4, num_kv_heads=4, hidden_size=64))
    sd = gqa.state_dict()
    for i in range(2):
        for name in ("k", "v"):
            w = sd[f"blocks.{i}.attn.{name}.weight"].view(2, 16, 64)
            sd[f"blocks.{i}.attn.{name}.weight"] = w.repeat_interleave(2, dim=0).reshape(64, 64)
    mha.load_state_dict(sd)
    x = torch.randint(0, 256, (2, 10))
    torch.testing.assert_close(gqa(x), mha(x))


def test_initial_loss_is_near_uniform_and_it_learns():
    torch.manual_seed(0)
    model = PaLM(PaLMConfig.preset("micro"))
    x = torch.randint(0, 256, (4, 33))
    idx, targets = x[:, :-1], x[:, 1:]
    first = model(idx, targets)
    assert abs(first.item() - math.log(256)) < 0.3
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(30):
        loss = model(idx, targets)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < first.item() - 2.0  # memorises the batch


def test_activation_checkpointing_gives_identical_gradients():
    torch.manual_seed(0)
    a = PaLM(PaLMConfig.preset("nano"))
    b = PaLM(PaLMConfig.preset("nano"))
    b.load_state_dict(a.state_dict())
    assert apply_activation_checkpointing(b) == 2
    x = torch.randint(0, 256, (2, 16))
    a(x, x).backward()
    b(x, x).backward()
    for (n, pa), pb in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(pa.grad, pb.grad, msg=n)


def _saved_bytes(model, x):
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(x, x)
    loss.backward()
    return total


def test_activation_checkpointing_saves_fewer_activations():
    torch.manual_seed(0)
    model = PaLM(PaLMConfig.preset("micro"))
    x = torch.randint(0, 256, (4, 64))
    plain = _saved_bytes(model, x)
    apply_activation_checkpointing(model)
    checkpointed = _saved_bytes(model, x)
    assert checkpointed < plain / 2, (checkpointed, plain)


def test_too_long_input_is_a_clear_error():
    with pytest.raises(ConfigError, match="exceeds max_seq_len 64"):
        PaLM(PaLMConfig.preset("nano"))(torch.zeros(1, 65, dtype=torch.long))
