"""The job's data path: ``colossal tokenizer train``, ``colossal data prepare`` and ``colossal
train --data/--tokenizer`` end to end; raw data trains exactly as its prepared folder does; a
``--model hf:DIR`` folder's own tokenizer is the default; a 2-rank resume with dropout is exact."""

from __future__ import annotations

import json

import pytest
from _checks_train_mesh import train_on_mesh

from colossal import TrainConfig, train
from colossal.cli import main
from colossal_contracts import ConfigError

TRAIN = ["--preset", "nano", "--steps", "3", "--batch-size", "2", "--seq-len", "16"]


@pytest.fixture(scope="module")
def data(
    tmp_path_factory,
):  # type: ignore[no-untyped-def]
    """A jsonl of documents, a BPE trained on it by the CLI, and the jsonl prepared with it."""
    from colossal_models import default_corpus_path

    root = tmp_path_factory.mktemp("data")
    lib = default_corpus_path()
    docs = [(lib / n).read_text() for n in ("textwrap.py", "shlex.py", "fnmatch.py", "glob.py")]
    jsonl = root / "docs.jsonl"
    jsonl.write_text("".join(json.dumps({"body": d}) + "\n" for d in docs))
    tok = root / "tok"
    assert main(["tokenizer", "train", "--corpus", str(jsonl), "--text-field", "body",
                 "--vocab-size", "400", "--out", str(tok)]) == 0  # fmt: skip
    prepared = root / "prepared"
    assert main(["data", "prepare", "--tokenizer", f"hf:{tok}", "--data", str(jsonl),
                 "--text-field", "body", "--out", str(prepared), "--workers", "2"]) == 0  # fmt: skip
    return {"root": root, "jsonl": jsonl, "tok": tok, "prepared": prepared}


def test_cli_trains_on_a_prepared_folder_with_its_tokenizer(data, tmp_path):
    out = tmp_path / "run"
    assert main(["train", *TRAIN, "--data", str(data["prepared"]), "--out", str(out)]) == 0
    info = json.loads((out / "checkpoint" / "step-3" / "trainer.json").read_text())
    assert info["tokenizer"] == f"hf:{data['prepared']}"  # the folder's own copy
    assert info["model_config"]["vocab_size"] == 400  # the vocabulary follows the tokenizer
    assert info["data"]["offset"] == 6 and len(info["rng"]) == 1


def test_raw_data_trains_exactly_as_its_prepared_folder(data, tmp_path):
    base = dict(preset="nano", steps=3, batch_size=2, seq_len=16)
    raw = train(TrainConfig.from_flags(**base, data=data["jsonl"], text_field="body",  # type: ignore[arg-type]
                            tokenizer=f"hf:{data['tok']}", out=tmp_path / "raw"))  # fmt: skip
    prep = train(TrainConfig.from_flags(**base, data=data["prepared"], out=tmp_path / "prep"))  # type: ignore[arg-type]
    assert raw.losses == prep.losses and raw.val_loss == prep.val_loss
    with pytest.raises(ConfigError, match="was prepared with the tokenizer"):
        train(TrainConfig.from_flags(**base, data=data["prepared"], tokenizer="bytes",  # type: ignore[arg-type]
                          out=tmp_path / "other"))  # fmt: skip
    assert not (tmp_path / "other").exists()


def test_an_hf_model_folder_trains_with_its_own_tokenizer(data, tmp_path):
    transformers = pytest.importorskip("transformers")
    model = tmp_path / "gpt2"
    transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, n_positions=32,
                            vocab_size=400).save_pretrained(model)  # fmt: skip
    (model / "tokenizer.json").write_bytes((data["tok"] / "tokenizer.json").read_bytes())
    out = tmp_path / "run"
    args = ["train", *TRAIN, "--model", f"hf:{model}", "--data", str(data["jsonl"])]
    assert main([*args, "--text-field", "body", "--out", str(out), "--plugin", "zero"]) == 0
    info = json.loads((out / "checkpoint" / "step-3" / "trainer.json").read_text())
    assert info["tokenizer"] == f"hf:{model}"


TWO_RANKS = [  # (id, plugin settings): dp2 for zero and gemini, tp2 for hybrid
    ("zero2", {"plugin": "zero", "zero_stage": 2}),
    ("gemini", {"plugin": "gemini"}),
    ("hybrid-tp2", {"tp": 2}),
]


@pytest.mark.parametrize("plugin", [c[1] for c in TWO_RANKS], ids=[c[0] for c in TWO_RANKS])
def test_resume_with_dropout_on_two_ranks_is_bit_identical(world, tmp_path, small_corpus, plugin):
    kw = dict(preset="nano", steps=4, batch_size=2, seq_len=16, data=str(small_corpus),
              dropout=0.1, checkpoint_every=2, export="none", **plugin)  # fmt: skip
    full = world(2).run(train_on_mesh, {**kw, "out": str(tmp_path / "full")})
    cut = tmp_path / "cut"
    world(2).run(train_on_mesh, {**kw, "out": str(cut)})
    (cut / "checkpoint" / "latest").write_text("step-2\n")
    resumed = world(2).run(train_on_mesh, {**kw, "out": str(cut), "resume": True})
    assert [r["losses"] for r in resumed] == [r["losses"][2:] for r in full]
    info = json.loads((cut / "checkpoint" / "step-2" / "trainer.json").read_text())
    assert len(info["rng"]) == 2
