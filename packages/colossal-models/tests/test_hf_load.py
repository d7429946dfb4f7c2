"""Hugging Face causal LMs from local files (``load_hf_causal_lm``, ``from_hf``): tiny random
models saved with ``save_pretrained`` to tmp folders (no download); saved weights load exactly,
a bare config builds the same weights under the same seed, the wrapper's loss is HF's own
shifted loss, the adapters give the HF logits within 1e-5, and bad paths or configs are one-line
``ConfigError``s."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from colossal_contracts import ConfigError
from colossal_models import GPT, PaLM
from colossal_models.hf import (
    HF_TP_ADAPTERS,
    HFCausalLM,
    from_hf,
    hf_adapter_config,
    hf_max_positions,
    hf_num_params,
    load_hf_causal_lm,
    load_hf_config,
)

transformers = pytest.importorskip("transformers")

TOL = {"atol": 1e-5, "rtol": 1e-5}
T = 16


def _configs() -> dict[str, object]:
    return {
        "gpt2": transformers.GPT2Config(
            n_layer=2, n_embd=32, n_head=4, vocab_size=300, n_positions=T,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
        ),
        "llama": transformers.LlamaConfig(
            num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=300, max_position_embeddings=T,
            bos_token_id=0, eos_token_id=0, pad_token_id=0,
        ),
    }  # fmt: skip


def _save(tmp_path, name: str, *, weights: bool = True):  # type: ignore[no-untyped-def]
    cfg = _configs()[name]
    folder = tmp_path / name
    if not weights:
        cfg.save_pretrained(folder)
        return folder, None
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():  # random norms and biases, so nothing maps by accident
        for n, p in hf.named_parameters():
            if p.dim() == 1:
                p.normal_(0.0 if n.endswith("bias") else 1.0, 0.1)
    hf.save_pretrained(folder)
    return folder, hf


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_saved_weights_load_exactly_and_the_loss_is_hfs_shifted_loss(tmp_path, name):
    folder, hf = _save(tmp_path, name)
    model = load_hf_causal_lm(folder)
    assert isinstance(model, HFCausalLM) and model.training
    got = dict(model.named_parameters())
    for n, p in hf.named_parameters():
        assert torch.equal(got[f"hf.{n}"], p), n
        assert got[f"hf.{n}"].dtype == torch.float32
    assert hf_num_params(load_hf_config(folder)) == sum(p.numel() for p in hf.parameters())
    seq = torch.randint(0, 256, (3, T + 1))
    with torch.no_grad():  # HF shifts labels itself; ours are shifted already
        want = hf.eval()(input_ids=seq[:, :-1], labels=seq[:, :-1]).loss
        ours = model.eval()(seq[:, :-2], seq[:, 1:-1])
    torch.testing.assert_close(ours, want, **TOL)


def test_a_bare_config_builds_the_same_weights_under_the_same_seed(tmp_path):
    folder, _ = _save(tmp_path, "llama", weights=False)
    built = []
    for _ in range(2):
        torch.manual_seed(5)
        built.append(load_hf_causal_lm(folder / "config.json").state_dict())
    torch.manual_seed(5)
    direct = transformers.AutoModelForCausalLM.from_config(_configs()["llama"]).state_dict()
    for n, v in direct.items():
        assert torch.equal(built[0][f"hf.{n}"], v) and torch.equal(built[1][f"hf.{n}"], v), n
    with torch.device("meta"):
        assert load_hf_causal_lm(folder).hf.model.embed_tokens.weight.is_meta


@pytest.mark.parametrize(("name", "family"), [("gpt2", GPT), ("llama", PaLM)])
def test_adapters_give_the_hf_logits(tmp_path, name, family):
    folder, hf = _save(tmp_path, name)
    ours = from_hf(folder)
    assert type(ours) is family and name in HF_TP_ADAPTERS
    assert ours.config.num_params() == sum(p.numel() for p in hf.parameters())
    idx = torch.randint(0, 300, (2, T))
    with torch.no_grad():
        torch.testing.assert_close(ours.eval()(idx), hf.eval()(idx).logits, **TOL)
    with torch.device("meta"):
        assert type(from_hf(folder)) is family


def test_no_adapter_names_the_architectures_that_have_one(tmp_path):
    cfg = transformers.OPTConfig(
        num_hidden_layers=1, hidden_size=16, ffn_dim=32, num_attention_heads=2,
        word_embed_proj_dim=16, vocab_size=300, max_position_embeddings=T,
    )  # fmt: skip
    cfg.save_pretrained(tmp_path)
    config = load_hf_config(tmp_path)
    assert hf_max_positions(config) == T
    with pytest.raises(ConfigError, match=r"'opt' has no adapter.*gpt2.*llama") as err:
        hf_adapter_config(config)
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="no adapter"):
        from_hf(tmp_path)


def test_bad_paths_and_configs_are_one_line_errors(tmp_path, monkeypatch):
    (tmp_path / "empty").mkdir()
    (tmp_path / "junk.json").write_text("{not json")
    (tmp_path / "untyped.json").write_text(json.dumps({"hidden_size": 8}))
    (tmp_path / "unknown.json").write_text(json.dumps({"model_type": "no-such-model"}))
    transformers.ViTConfig(hidden_size=8, num_hidden_layers=1).save_pretrained(tmp_path / "vit")
    cases = {
        "missing": "no such file or folder",
        "empty": "has no config.json",
        "junk.json": "cannot read config.json as JSON|cannot read junk.json as JSON",
        "untyped.json": "has no model_type",
        "unknown.json": "does not know model_type 'no-such-model'",
        "vit": "'vit' is not a causal language model",
    }
    for name, message in cases.items():
        with pytest.raises(ConfigError, match=message) as err:
            load_hf_causal_lm(tmp_path / name)
        assert "\n" not in str(err.value), name
    monkeypatch.setitem(sys.modules, "transformers", None)  # as if it were not installed
    with pytest.raises(ConfigError, match=r"pip install 'colossal-models\[hf\]'"):
        load_hf_config(tmp_path / "vit")
