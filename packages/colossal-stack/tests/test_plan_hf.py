"""``colossal plan --model hf:PATH``: the shape of a Hugging Face causal LM read from a local
``config.json`` (GPT-2, Llama, Mistral, Qwen2, GPT-NeoX, OPT), its parameter count against the
transformers model built from the same config on the meta device (exact), planning it, and the
one-line errors for a missing path, an architecture that is not a supported causal LM and a
sequence longer than its positions."""

from __future__ import annotations

import json

import pytest
import torch

from colossal.cli import main
from colossal.plan import model_shape

V, POS = 320, 128
CONFIGS = {
    "gpt2": dict(n_layer=2, n_embd=64, n_head=4, n_positions=POS, bos_token_id=0, eos_token_id=0),
    "llama": dict(
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=176,
        max_position_embeddings=POS,
    ),
    "mistral": dict(
        num_hidden_layers=3,
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=1,
        intermediate_size=160,
        max_position_embeddings=POS,
    ),
    "qwen2": dict(
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=160,
        max_position_embeddings=POS,
        tie_word_embeddings=True,
    ),
    "gpt_neox": dict(
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        intermediate_size=256,
        max_position_embeddings=POS,
    ),
    "opt": dict(
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        ffn_dim=256,
        max_position_embeddings=POS,
        word_embed_proj_dim=64,
    ),
}


def _write(folder, model_type: str, **fields) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    cfg = {"model_type": model_type, "vocab_size": V, **fields}
    (folder / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("family", list(CONFIGS))
def test_hf_shape_counts_the_models_parameters(family, tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = CONFIGS[family]
    _write(tmp_path, family, **fields)
    # a saved folder for one family, the config.json file itself for the others
    shape = model_shape(f"hf:{tmp_path if family == 'llama' else tmp_path / 'config.json'}", "")
    with torch.device("meta"):
        ref = AutoModelForCausalLM.from_config(
            AutoConfig.for_model(model_type=family, vocab_size=V, **fields)
        )
    assert shape.params == sum(p.numel() for p in ref.parameters())
    assert (shape.hidden, shape.heads, shape.vocab, shape.max_positions) == (64, 4, V, POS)
    assert shape.layers == fields.get("num_hidden_layers", fields.get("n_layer"))
    assert shape.gated == (family in ("llama", "mistral", "qwen2"))
    assert shape.kv_heads == fields.get("num_key_value_heads", 4)


def test_plan_cli_plans_an_hf_model(tmp_path, capsys):
    _write(tmp_path / "llama", "llama", **CONFIGS["llama"])
    argv = ["plan", "--model", f"hf:{tmp_path / 'llama'}", "--hardware", "rtx2060-6g"]
    assert main([*argv, "--devices", "2", "--global-batch", "2", "--seq-len", "64", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["request"].startswith("hf-llama-2x64") and out["plans"][0]["fits"]


@pytest.mark.parametrize(
    "config,argv,message",
    [
        (None, [], "no config.json there"),
        ({"model_type": "bert"}, [], "'bert' is not a supported causal LM; supported: gpt2"),
        ("not json", [], "is not JSON"),
        ({"model_type": "gpt2", "n_positions": 64}, ["--seq-len", "128"], "exceeds"),
    ],
)
def test_plan_cli_hf_bad_input_is_one_line(tmp_path, capsys, config, argv, message):
    if config is not None:
        text = config if isinstance(config, str) else json.dumps(config)
        (tmp_path / "config.json").write_text(text)
    assert main(["plan", "--model", f"hf:{tmp_path}", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err and len(err.splitlines()) == 1
