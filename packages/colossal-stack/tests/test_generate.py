"""``colossal generate`` / ``colossal.generate``: with the KV cache GPT and PaLM give the tokens
they give without it (greedy); GPT's greedy tokens equal ``transformers``' ``generate`` on its
GPT-2 export; sampling is reproducible by seed and top-k 1 is greedy; weights streamed through
Gemini's chunks under a budget smaller than the model give the same tokens with the
accelerator's peak within the budget; bad input is a one-line error."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from colossal import Booster, DDPPlugin, export_hf, generate
from colossal.cli import main
from colossal.inference import load_for_generation
from colossal_contracts import ConfigError
from colossal_models import GPT, GPTConfig, PaLM, PaLMConfig

PROMPT = "def main():\n"


def _checkpoint(model, root, family: str):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    extra = {"train_config": {"model": family}, "model_config": dataclasses.asdict(model.config)}
    return Booster(DDPPlugin()).save(model, opt, root, step=1, extra=extra)


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("gen")
    torch.manual_seed(0)
    return {
        "gpt": _checkpoint(GPT(GPTConfig.preset("nano")), root / "gpt", "gpt"),
        "palm": _checkpoint(PaLM(PaLMConfig.preset("nano")), root / "palm", "palm"),
    }


@pytest.mark.parametrize("family", ["gpt", "palm"])
def test_the_kv_cache_gives_the_tokens_of_full_recomputation(ckpts, family):
    cached = generate(ckpts[family], PROMPT, max_new_tokens=40)
    full = generate(ckpts[family], PROMPT, max_new_tokens=40, use_cache=False)
    assert cached.new_ids == full.new_ids and len(cached.new_ids) == 40
    assert cached.text == PROMPT + cached.new_text


def test_gpt_greedy_equals_transformers_generate_on_its_gpt2_export(ckpts, tmp_path):
    transformers = pytest.importorskip("transformers")
    ours = generate(ckpts["gpt"], PROMPT, max_new_tokens=30)
    export_hf(ckpts["gpt"], tmp_path / "gpt2")
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "gpt2").eval()
    ids = torch.tensor([ours.prompt_ids])
    theirs = hf.generate(ids, max_new_tokens=30, do_sample=False, pad_token_id=0, eos_token_id=None)
    assert theirs[0, ids.shape[1] :].tolist() == ours.new_ids


def test_sampling_is_reproducible_by_seed(ckpts):
    kw = {"max_new_tokens": 20, "temperature": 1.0, "top_k": 40, "top_p": 0.95}
    a = generate(ckpts["gpt"], PROMPT, seed=1, **kw)
    b = generate(ckpts["gpt"], PROMPT, seed=1, **kw)
    c = generate(ckpts["gpt"], PROMPT, seed=2, **kw)
    assert a.new_ids == b.new_ids and a.new_ids != c.new_ids
    greedy = generate(ckpts["gpt"], PROMPT, max_new_tokens=20)
    top1 = generate(ckpts["gpt"], PROMPT, max_new_tokens=20, temperature=0.7, top_k=1, seed=5)
    assert top1.new_ids == greedy.new_ids


@pytest.mark.parametrize("use_cache", [True, False])
def test_offloaded_weights_stream_through_a_budget_smaller_than_the_model(ckpts, use_cache):
    want = generate(ckpts["gpt"], PROMPT, max_new_tokens=12)
    loaded = load_for_generation(ckpts["gpt"])
    model_bytes = sum(p.numel() * 4 for p in loaded.model.parameters())
    budget = model_bytes // 3
    got = generate(
        loaded, PROMPT, max_new_tokens=12, use_cache=use_cache, accelerator_budget=budget
    )
    assert got.new_ids == want.new_ids
    assert 0 < got.memory["accelerator_peak_bytes"] <= budget
    assert got.memory["bytes_moved"] > model_bytes  # chunks came in more than once


def test_bad_input_is_one_line(ckpts, tmp_path, capsys):
    assert main(["generate", "--checkpoint", str(tmp_path), "--prompt", "x"]) == 2
    err = capsys.readouterr().err
    assert "is not a checkpoint" in err and err.count("\n") == 1
    base = ["generate", "--checkpoint", str(ckpts["gpt"]), "--prompt", "x"]
    assert main([*base, "--temperature", "-1"]) == 2
    assert "--temperature must be >= 0" in capsys.readouterr().err
    assert main([*base, "--max-new-tokens", "100"]) == 2  # nano has 64 positions
    assert "more than the model's 64" in capsys.readouterr().err
    assert main([*base, "--max-new-tokens", "3"]) == 0
    assert capsys.readouterr().out.startswith("x")
    with pytest.raises(ConfigError, match="top-p"):
        generate(ckpts["gpt"], "x", top_p=0.0)
