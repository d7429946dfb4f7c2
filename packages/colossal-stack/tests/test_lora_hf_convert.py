"""``colossal.lora.hf_lora_to_ours``: a ``peft`` model of a Hugging Face GPT-2 or Llama, as the
hybrid plugin trains it ([Note: Hugging Face LoRA under tp]), gives the Hugging Face model's
logits, and its trainable parameters are the adapters under the user's names. One process."""

from __future__ import annotations

import pytest
import torch
import transformers
from peft import LoraConfig, get_peft_model

from colossal.lora import hf_lora_to_ours
from colossal_models.hf import HFCausalLM


def _gpt2() -> torch.nn.Module:
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16)
    return transformers.GPT2LMHeadModel(cfg)


def _llama() -> torch.nn.Module:
    cfg = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(cfg)


# (build, targets, tolerance in float64: Llama's RMSNorm and rotary compute in fp32 in HF)
MODELS = {
    "gpt2": (_gpt2, ["c_attn", "c_proj", "c_fc"], 1e-12),
    "llama": (_llama, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "down_proj"], 1e-5),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_converted_peft_model_gives_the_hf_logits(name):
    build, targets, tol = MODELS[name]
    torch.manual_seed(0)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=targets, init_lora_weights=False)
    model = HFCausalLM(get_peft_model(build().double().eval(), lora))
    with torch.no_grad():  # large adapters: a misplaced one moves the logits by far more than tol
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.mul_(30)
    before = torch.random.get_rng_state()
    converted = hf_lora_to_ours(model)
    assert converted is not None
    assert torch.equal(torch.random.get_rng_state(), before)  # the caller's draws stay put
    x = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model.hf(input_ids=x).logits
        with model.hf.disable_adapter():
            assert (model.hf(input_ids=x).logits - want).abs().max() > 0.1  # adapters act
        got = converted.model.eval()(x)
    assert float((got - want).abs().max()) <= tol
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    mine = {n for n, p in converted.model.named_parameters() if p.requires_grad}
    assert set(converted.names) == mine and set(converted.names.values()) == trainable
    assert all(".lora_" in n for n in trainable)


def test_other_models_are_not_converted():
    from colossal_models import GPT, GPTConfig

    gpt = GPT(GPTConfig(vocab_size=64, max_seq_len=16, num_layers=1, num_heads=2, hidden_size=16))
    assert hf_lora_to_ours(gpt) is None
    assert hf_lora_to_ours(HFCausalLM(_gpt2())) is None  # no peft: trained as it is
