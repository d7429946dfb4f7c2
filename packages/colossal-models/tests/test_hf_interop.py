"""Hugging Face interop: random HF models built from configs (no download), logits within 1e-5."""

import sys
from pathlib import Path

import pytest
import torch

from colossal_contracts import ConfigError
from colossal_models import GPT, PaLM, PaLMConfig
from colossal_models.gpt.state_dict import GPT2StateDictAdapter
from colossal_models.palm.state_dict import LlamaStateDictAdapter

transformers = pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).parent))
import _checks_models_tp as checks  # noqa: E402

TOL = {"atol": 1e-5, "rtol": 1e-5}


def _hf_gpt2(**kw):
    torch.manual_seed(0)
    base = dict(n_layer=2, n_embd=64, n_head=4, vocab_size=300, n_positions=32)
    base.update(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    base.update(kw)
    cfg = transformers.GPT2Config(**base, bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():  # random LayerNorm affines and biases, so nothing maps by accident
        for n, p in model.named_parameters():
            if p.dim() == 1:
                p.normal_(0.0 if n.endswith("bias") else 1.0, 0.1)
    return model


@pytest.mark.parametrize("n_inner", [None, 96])
def test_gpt_loaded_from_hf_gpt2_gives_the_same_logits(n_inner):
    hf = _hf_gpt2(n_inner=n_inner)
    cfg = GPT2StateDictAdapter.config_from_hf(hf.config)
    adapter = GPT2StateDictAdapter(cfg)
    ours = GPT(cfg).eval()
    ours.load_state_dict(adapter.from_hf(hf.state_dict()))
    idx = torch.randint(0, 300, (3, 32))
    with torch.no_grad():
        torch.testing.assert_close(ours(idx), hf(idx).logits, **TOL)
    # round trip: back to HF, bit-exact, and a fresh HF model loads it strictly
    back = adapter.to_hf(ours.state_dict())
    hf_sd = hf.state_dict()
    assert back.keys() == {k for k in hf_sd if not k.endswith((".attn.bias", ".masked_bias"))}
    for k, v in back.items():
        assert torch.equal(v, hf_sd[k]), k
    fresh = transformers.GPT2LMHeadModel(adapter.config_to_hf(bos_token_id=0, eos_token_id=0))
    fresh.load_state_dict(back, strict=False)
    with torch.no_grad():
        torch.testing.assert_close(fresh.eval()(idx).logits, hf(idx).logits, **TOL)


def test_hf_gpt2_trained_from_ours_matches_after_a_step():
    # gradients agree too: one SGD step on each side keeps the logits equal
    hf = _hf_gpt2()
    adapter = GPT2StateDictAdapter(GPT2StateDictAdapter.config_from_hf(hf.config))
    ours = GPT(adapter.config)
    ours.load_state_dict(adapter.from_hf(hf.state_dict()))
    idx = torch.randint(0, 300, (2, 16))
    for model, loss_of in (
        (ours, lambda: ours(idx[:, :-1], idx[:, 1:])),
        (hf, lambda: hf(idx, labels=idx).loss),
    ):
        model.train()
        loss_of().backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.5 * p.grad
    back = adapter.to_hf(ours.state_dict())
    for k, v in back.items():
        torch.testing.assert_close(v, hf.state_dict()[k], atol=1e-5, rtol=1e-4, msg=k)


def test_gpt2_options_without_an_equivalent_are_refused():
    with pytest.raises(ConfigError, match="tanh GELU"):
        GPT2StateDictAdapter.config_from_hf(transformers.GPT2Config(activation_function="relu"))
    cfg = GPT2StateDictAdapter.config_from_hf(_hf_gpt2().config)
    with pytest.raises(ConfigError, match="missing"):
        GPT2StateDictAdapter(cfg).from_hf({"transformer.wte.weight": torch.zeros(1)})


def _hf_llama(**kw):
    torch.manual_seed(0)
    base = dict(
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=1,
        intermediate_size=96,
        vocab_size=300,
        max_position_embeddings=64,
        rms_norm_eps=1e-6,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=None,
    )
    base.update(kw)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**base)).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.normal_(1.0, 0.1)
    return model


@pytest.mark.parametrize(
    "kw",
    [
        {},  # multi-query, untied
        {"num_key_value_heads": 2, "tie_word_embeddings": True, "rope_theta": 500000.0},
        {"num_key_value_heads": 4, "head_dim": 32},  # heads * head_dim != hidden_size
    ],
)
def test_llama_shaped_palm_gives_the_same_logits_and_round_trips(kw):
    hf = _hf_llama(**kw)
    cfg = LlamaStateDictAdapter.config_from_hf(hf.config)
    assert cfg.num_kv_heads == hf.config.num_key_value_heads
    adapter = LlamaStateDictAdapter(cfg)
    ours = PaLM(cfg).eval()
    ours.load_state_dict(adapter.from_hf(hf.state_dict()))
    idx = torch.randint(0, 300, (2, 40))
    with torch.no_grad():
        torch.testing.assert_close(ours(idx), hf(idx).logits, **TOL)
    back = adapter.to_hf(ours.state_dict())
    hf_sd = hf.state_dict()
    assert back.keys() == hf_sd.keys()
    for k, v in back.items():
        assert torch.equal(v, hf_sd[k]), k
    fresh = transformers.LlamaForCausalLM(adapter.config_to_hf(bos_token_id=0, eos_token_id=0))
    fresh.load_state_dict(back)
    with torch.no_grad():
        torch.testing.assert_close(fresh.eval()(idx).logits, hf(idx).logits, **TOL)


def test_palm_proper_is_not_llama_shaped():
    with pytest.raises(ConfigError, match=r"parallel_block=True.*two RMSNorms"):
        LlamaStateDictAdapter(PaLMConfig.preset("nano"))
    with pytest.raises(ConfigError, match="silu"):
        LlamaStateDictAdapter.config_from_hf(transformers.LlamaConfig(hidden_act="gelu"))


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_hf_llama_converted_then_tensor_parallel_gives_hf_logits(world, sequence_parallel):
    results = world(2).run(checks.hf_llama_under_tp, sequence_parallel)
    assert max(err for err, _ in results) < 1e-5, results
    assert all(exact for _, exact in results)  # export back to HF from the shards
