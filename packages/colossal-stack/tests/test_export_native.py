"""Native models to Hugging Face layouts: a GPT trained by ``colossal train`` (DDP; Gemini
saved with ``--export none``, read from its shards) exports to ``GPT2LMHeadModel`` and a
Llama-shaped PaLM to ``LlamaForCausalLM`` with our logits (fp32, within 1e-5); a PaLM proper
(parallel block, LayerNorm, multi-query) is refused in one line, before anything is written.
Every export holds the run's tokenizer for ``AutoTokenizer``: the byte tokenizer's files (the
byte ids exactly), or a ``--tokenizer hf:DIR``'s own files (a GPT-2 style vocab.json +
merges.txt folder gets a tokenizer.json beside them)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

pytest.importorskip("transformers")

import transformers

from colossal import Booster, DDPPlugin, export_hf
from colossal.cli import main
from colossal.export import iter_checkpoint_state, read_checkpoint
from colossal_contracts import ConfigError
from colossal_models import GPT, ByteTokenizer, GPTConfig, PaLM, PaLMConfig
from colossal_models.data import load_tokenizer, train_tokenizer

TEXTS = [
    "def main(argv):\n    return 0\n",
    "héllo wörld, naïve",
    "日本語 🙂👍🏽",
    "a<|endoftext|>b",
]


def _bytes_tokenizer_loads(folder) -> None:
    """``AutoTokenizer`` on an export of a byte-tokenizer run gives the byte ids exactly."""
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    assert tok.eos_token_id == 0
    for text in TEXTS:
        ids = tok(text)["input_ids"]
        assert ids == ByteTokenizer().encode(text).tolist() and tok.decode(ids) == text


def _train(tmp_path, corpus, name: str, *flags: str):
    argv = ["train", "--model", "gpt", "--preset", "nano", "--steps", "2", "--batch-size", "2"]
    argv += ["--seq-len", "16", "--corpus", str(corpus), "--out", str(tmp_path / name), *flags]
    assert main(argv) == 0
    return tmp_path / name


@pytest.mark.parametrize(
    "plugin", [("--plugin", "ddp"), ("--plugin", "gemini", "--export", "none")]
)
def test_gpt_exports_to_gpt2_with_our_logits(tmp_path, small_corpus, plugin):
    run = _train(tmp_path, small_corpus, "run", *plugin)
    assert not (run / "hf").exists()  # a native run exports on request only
    assert main(["export", str(run), "--hf", str(tmp_path / "gpt2")]) == 0
    _bytes_tokenizer_loads(tmp_path / "gpt2")
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "gpt2").eval()
    assert type(hf).__name__ == "GPT2LMHeadModel"
    info = read_checkpoint(run)
    ours = GPT(GPTConfig(**info.model_config)).eval()
    ours.load_state_dict(dict(iter_checkpoint_state(info)))
    idx = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(hf(idx).logits, ours(idx), atol=1e-5, rtol=0)


def _save(model, root, family: str):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    extra = {"train_config": {"model": family}, "model_config": dataclasses.asdict(model.config)}
    return Booster(DDPPlugin()).save(model, opt, root, step=1, extra=extra)


def test_llama_shaped_palm_exports_to_llama_with_our_logits(tmp_path):
    torch.manual_seed(0)
    cfg = PaLMConfig.preset(
        "nano",
        num_heads=4,
        num_kv_heads=2,
        parallel_block=False,
        norm="rmsnorm",
        tie_embeddings=False,
    )
    ours = PaLM(cfg).eval()
    step = _save(ours, tmp_path / "ckpt", "palm")
    export_hf(step, tmp_path / "llama")
    _bytes_tokenizer_loads(tmp_path / "llama")  # a checkpoint recording no tokenizer: bytes
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "llama").eval()
    assert type(hf).__name__ == "LlamaForCausalLM"
    assert hf.config.num_key_value_heads == 2
    idx = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(hf(idx).logits, ours(idx), atol=1e-5, rtol=0)


def test_a_palm_proper_is_refused_before_anything_is_written(tmp_path):
    step = _save(PaLM(PaLMConfig.preset("nano")), tmp_path / "ckpt", "palm")
    with pytest.raises(ConfigError, match=r"parallel_block=True.*two RMSNorms") as err:
        export_hf(step, tmp_path / "llama")
    assert "\n" not in str(err.value)
    assert not (tmp_path / "llama").exists()


def test_a_run_with_an_hf_tokenizer_exports_that_tokenizer(tmp_path, small_corpus, capsys):
    """``--tokenizer hf:DIR`` on a GPT-2 style folder (vocab.json + merges.txt only)."""
    made = train_tokenizer(
        iter([p.read_text() for p in small_corpus.iterdir()]), vocab_size=400, out=tmp_path / "bpe"
    )
    folder = tmp_path / "gpt2-style"
    folder.mkdir()
    made.backend.model.save(str(folder))  # vocab.json, merges.txt: no tokenizer.json
    run = _train(tmp_path, small_corpus, "run", "--tokenizer", f"hf:{folder}")
    trainer = json.loads(next((run / "checkpoint").glob("step-*/trainer.json")).read_text())
    assert trainer["tokenizer"] == f"hf:{folder}"
    assert main(["export", str(run), "--hf", str(tmp_path / "gpt2")]) == 0
    out = tmp_path / "gpt2"
    assert {"vocab.json", "merges.txt", "tokenizer.json"} <= {p.name for p in out.iterdir()}
    assert (out / "merges.txt").read_bytes() == (folder / "merges.txt").read_bytes()
    ours = load_tokenizer(f"hf:{folder}")
    auto = transformers.AutoTokenizer.from_pretrained(out)
    assert [auto(t)["input_ids"] for t in TEXTS] == ours.encode_batch(TEXTS)
    assert auto.vocab_size == ours.vocab_size == 400
    # the tokenizer's files gone: one line, nothing written
    folder.rename(tmp_path / "moved")
    assert main(["export", str(run), "--hf", str(tmp_path / "again")]) == 2
    err = capsys.readouterr().err
    assert "trained with the tokenizer" in err and "cannot be read now" in err
    assert not (tmp_path / "again").exists()
