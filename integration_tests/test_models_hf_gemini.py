"""An unmodified Hugging Face causal LM trained with Gemini: its parameters live in chunks that
move between tiers, its forward is Hugging Face's own, and the losses are plain AdamW's."""

import copy

import pytest
import torch

from colossal_zero import GeminiConfig, GeminiOptimizer, apply_gemini

transformers = pytest.importorskip("transformers")


def _gpt2():
    cfg = transformers.GPT2Config(
        n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=64, bos_token_id=0,
        eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(cfg)


def _llama():
    cfg = transformers.LlamaConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=1,
        intermediate_size=128, vocab_size=256, max_position_embeddings=64, bos_token_id=0,
        eos_token_id=0,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(cfg)


def _train(model, optimizer, backward, batch, steps=5):
    losses = []
    for _ in range(steps):
        loss = model(input_ids=batch, labels=batch).loss
        backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("build", [_gpt2, _llama], ids=["gpt2", "llama"])
def test_unmodified_hf_model_trains_under_gemini_like_plain_adamw(build):
    torch.manual_seed(0)
    ref = build()
    hf = copy.deepcopy(ref)
    kind = type(hf)
    batch = torch.randint(0, 256, (4, 32), generator=torch.Generator().manual_seed(0))

    opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    expected = _train(ref, opt, lambda loss: loss.backward(), batch)

    # 3/4 of the fp32 parameter bytes on the (emulated) accelerator tier: chunks must move
    budget = sum(p.numel() * 4 for p in hf.parameters()) * 3 // 4
    gm = apply_gemini(hf, GeminiConfig(device="cpu", accelerator_bytes=budget), group=None)
    gopt = GeminiOptimizer.from_torch(gm, torch.optim.AdamW(hf.parameters(), lr=1e-3))
    got = _train(gm, gopt, gopt.backward, batch)

    assert type(gm.module) is kind  # no model rewrite: the HF class and forward are untouched
    assert got == pytest.approx(expected, rel=1e-5)
    assert got[-1] < got[0]
    stats = gm.memory_stats()
    assert stats.tiers["accelerator"].peak_bytes <= budget
    assert stats.moves[("host", "accelerator")].num_bytes > 0  # chunks really moved


def test_hf_model_through_the_gemini_plugin():
    booster = pytest.importorskip("colossal.booster")
    if not hasattr(booster, "GeminiPlugin"):
        pytest.skip("the Booster's Gemini plugin is not there yet")
    torch.manual_seed(0)
    model = _llama()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    b = booster.Booster(booster.GeminiPlugin())
    model, opt = b.boost(model, opt)
    batch = torch.randint(0, 256, (4, 32), generator=torch.Generator().manual_seed(0))
    losses = []
    for _ in range(5):
        loss = model(input_ids=batch, labels=batch).loss
        b.backward(loss, opt)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
