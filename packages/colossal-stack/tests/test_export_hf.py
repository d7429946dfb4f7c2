"""A Hugging Face round trip: a tiny GPT-2 folder (with a ``tokenizers``-built tokenizer)
trained by ``colossal train --model hf:DIR --data docs.jsonl`` on 2 ranks under Gemini, Gemini
with tp 2, ZeRO-2, DDP and the hybrid plugin (tp 2), the jsonl tokenized by the model's own
tokenizer (not bytes), leaves ``--out/hf``, which ``AutoModelForCausalLM`` and
``AutoTokenizer.from_pretrained`` load (the tokenizer giving the ids the run trained on), with
the logits of the trained model as Colossal rebuilds it from its checkpoint (fp32, within
1e-5); greedy ``colossal.generate`` on the run gives ``transformers``' ``generate`` token for
token. Helpers in ``_checks_export.py``."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")

import transformers
from _checks_export import our_logits, train_runs, write_gpt2_folder, write_jsonl

from colossal import export_hf, generate
from colossal_models.data import load_tokenizer

RUNS = {
    "gemini": {"plugin": "gemini"},
    "gemini-tp2": {"plugin": "gemini", "tp": 2},
    "zero2": {"plugin": "zero", "zero_stage": 2},
    "ddp": {"plugin": "ddp"},
    "hybrid-tp2": {"tp": 2},
}


@pytest.fixture(scope="module")
def trained(world, tmp_path_factory):
    """The runs, trained in one 2-rank World: {name: --out folder}."""
    root = tmp_path_factory.mktemp("export")
    docs = write_jsonl(root / "docs.jsonl", ("argparse.py", "textwrap.py"))
    folder = write_gpt2_folder(root / "gpt2", "".join(docs))
    base = {"model": f"hf:{folder}", "steps": 2, "batch_size": 2, "seq_len": 16}
    runs = [{**base, **kw, "data": root / "docs.jsonl", "out": root / n} for n, kw in RUNS.items()]
    world(2).run(train_runs, runs)
    return {n: root / n for n in RUNS}


@pytest.mark.parametrize("name", RUNS)
def test_the_run_trained_on_the_jsonl_with_the_models_own_tokenizer(trained, name):
    step = next((trained[name] / "checkpoint").glob("step-*"))
    record = json.loads((step / "trainer.json").read_text())
    folder = trained[name].parent / "gpt2"
    assert record["tokenizer"] == f"hf:{folder}"  # not bytes
    assert record["train_config"]["data"] == str(trained[name].parent / "docs.jsonl")
    # the export's tokenizer gives the ids the data path gave (the model folder's tokenizer)
    tok = transformers.AutoTokenizer.from_pretrained(trained[name] / "hf")
    ours = load_tokenizer(f"hf:{folder}")
    assert ours.vocab_size == 300 and tok.eos_token_id == ours.eot_id
    texts = ["def main(argv):\n    return 0", "wrap(text, width=70) <|endoftext|>"]
    assert [tok(t)["input_ids"] for t in texts] == ours.encode_batch(texts)


@pytest.mark.parametrize("name", RUNS)
def test_the_final_export_loads_in_transformers_with_our_logits(trained, name):
    folder = trained[name] / "hf"
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["GPT2LMHeadModel"] and config["vocab_size"] == 300
    index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    assert "transformer.wte.weight" in index and "lm_head.weight" not in index  # tied: once
    assert not any(k.startswith("hf.") for k in index)
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    assert hf.lm_head.weight is hf.transformer.wte.weight
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    ids = torch.tensor([tok("def main(argv):\n    return 0")["input_ids"][:16]])
    with torch.no_grad():
        theirs = hf(ids).logits
    torch.testing.assert_close(theirs, our_logits(trained[name], ids), atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", ["gemini", "hybrid-tp2"])
def test_greedy_generate_equals_transformers_generate(trained, name):
    ours = generate(trained[name], "import os\n", max_new_tokens=24)
    hf = transformers.AutoModelForCausalLM.from_pretrained(trained[name] / "hf").eval()
    ids = torch.tensor([ours.prompt_ids])
    theirs = hf.generate(ids, max_new_tokens=24, do_sample=False, pad_token_id=0)
    assert theirs[0, ids.shape[1] :].tolist() == ours.new_ids
    assert len(ours.new_ids) == 24 or ours.new_ids[-1] == 0  # stopped at end-of-text only
    # the HF model's weights streamed through Gemini's chunks: the same tokens
    offloaded = generate(trained[name], "import os\n", max_new_tokens=24, accelerator_budget=80_000)
    assert offloaded.new_ids == ours.new_ids
    assert offloaded.memory["accelerator_peak_bytes"] <= 80_000 < 4 * hf.num_parameters()


def test_colossal_export_rewrites_any_checkpoint_folder(trained, tmp_path, capsys):
    from colossal.cli import main

    step = next((trained["zero2"] / "checkpoint").glob("step-*"))
    assert main(["export", str(step), "--hf", str(tmp_path / "again")]) == 0
    first = transformers.AutoModelForCausalLM.from_pretrained(trained["zero2"] / "hf")
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "again")
    for (n, a), (_, b) in zip(first.state_dict().items(), again.state_dict().items(), strict=True):
        assert torch.equal(a, b), n
    assert main(["export", str(step), "--hf", str(tmp_path / "again")]) == 2
    assert "not empty" in capsys.readouterr().err
    with pytest.raises(Exception, match="not a checkpoint"):
        export_hf(tmp_path, tmp_path / "x")
