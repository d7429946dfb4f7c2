"""LoRA's bad inputs, each one line before training with the run in ``--out`` unchanged (the
rows of test_bad_inputs' table for ``--lora-*``): targets that match nothing (naming the
model's linear layers), a rank of 0 or above a layer's width, flags without ``--lora-rank``,
LoRA on a layout it does not run on yet (pipeline stages, Gemini with tp), LoRA with an
optimizer that is not Adam/AdamW (the Python API: the job always builds AdamW), a Hugging Face
peft model beyond plain LoRA under the hybrid plugin, and a resume on other base weights."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model

from colossal import Booster, DDPPlugin, TrainConfig, train
from colossal.cli import main
from colossal_contracts import ConfigError
from colossal_models import GPT, GPTConfig

TRAIN = ["train", "--preset", "nano", "--batch-size", "2", "--seq-len", "16", "--steps", "3"]
LORA = [*TRAIN, "--plugin", "ddp", "--lora-rank", "4"]
CASES = [  # (id, argv, message); each resumes the LoRA run in --out
    ("targets-nothing", [*LORA, "--lora-targets", "wq"], "its linear layers are: attn.qkv"),
    ("targets-empty", [*LORA, "--lora-targets", ","], "--lora-targets is empty"),
    ("rank-zero", [*TRAIN, "--plugin", "ddp", "--lora-rank", "0"], "--lora-rank must be a"),
    ("rank-above-width", [*TRAIN, "--plugin", "ddp", "--lora-rank", "65"], "use --lora-rank 64"),
    ("alpha-negative", [*LORA, "--lora-alpha=-1"], "--lora-alpha must be positive"),
    ("dropout-one", [*LORA, "--lora-dropout", "1"], "--lora-dropout must be in [0, 1)"),
    ("alpha-no-rank", [*TRAIN, "--plugin", "ddp", "--lora-alpha", "8"], "needs --lora-rank"),
    ("merged-no-rank", [*TRAIN, "--plugin", "ddp", "--export", "merged"], "needs --lora-rank"),
    ("lora-pp", [*LORA, "--plugin", "hybrid", "--pp", "2"], "nearest that builds: zero0"),
    ("lora-gemini-tp", [*LORA, "--plugin", "gemini", "--tp", "2"], "builds: tp 1d + zero2"),
    ("other-base", [*LORA, "--seed", "1"], "the base weights differ"),
    ("other-rank", [*TRAIN, "--plugin", "ddp", "--lora-rank", "8"], "trained LoRA with rank 4"),
    ("lora-dropped", [*TRAIN, "--plugin", "ddp"], "is of LoRA, this run is not"),
]


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):  # type: ignore[no-untyped-def]
    """A finished LoRA run (ddp, gpt-nano, 2 steps) and its corpus."""
    from colossal_models import default_corpus_path

    root = tmp_path_factory.mktemp("lora-bad")
    corpus = root / "corpus.txt"
    corpus.write_bytes((default_corpus_path() / "textwrap.py").read_bytes())
    run = root / "run"
    kw = dict(preset="nano", steps=2, batch_size=2, seq_len=16, data=corpus, out=run)
    train(TrainConfig.from_flags(**kw, plugin="ddp", lora_rank=4, export="none"))  # type: ignore[arg-type]
    return run, corpus


def _snapshot(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.mark.parametrize("argv,message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_lora_bad_input(lora_run, capsys, argv, message):
    run, corpus = lora_run
    before = _snapshot(run)
    assert main([*argv, "--data", str(corpus), "--out", str(run), "--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err[-2000:]
    assert err.startswith("error: ") and message in err, err
    assert _snapshot(run) == before


def test_lora_with_sgd_refused():
    torch.manual_seed(0)
    model = get_peft_model(GPT(GPTConfig.preset("nano")), LoraConfig(r=4, target_modules=["qkv"]))
    sgd = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    with pytest.raises(ConfigError, match=r"LoRA trains with torch\.optim\.Adam or AdamW, got SGD"):
        Booster(DDPPlugin()).boost(model, sgd)


@pytest.mark.parametrize(
    "settings,message",
    [
        ({"use_dora": True}, "c_attn is DoRA, not plain LoRA"),
        ({"bias": "lora_only"}, "c_attn.base_layer.bias trains and is not a LoRA adapter"),
        ({"rank_pattern": {"c_fc": 2}}, "has its own rank or alpha"),
    ],
    ids=["dora", "trained-bias", "rank-pattern"],
)
def test_hf_lora_beyond_plain_adapters_refused_under_hybrid(settings, message):
    """The hybrid plugin trains a Hugging Face peft model as our GPT only for plain LoRA on
    linear layers ([Note: Hugging Face LoRA under tp]); anything else is one line, before any
    process group or copy."""
    import transformers

    from colossal import HybridParallelPlugin
    from colossal_models.hf import HFCausalLM

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=32, n_positions=8)
    lora = LoraConfig(r=4, target_modules=["c_attn", "c_fc"], fan_in_fan_out=True, **settings)
    model = HFCausalLM(get_peft_model(transformers.GPT2LMHeadModel(cfg), lora))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    plugin = HybridParallelPlugin()
    with pytest.raises(ConfigError, match="LoRA on a Hugging Face model under tensor") as err:
        Booster(plugin).boost(model, opt)
    plugin.close()
    assert message in str(err.value) and "\n" not in str(err.value), str(err.value)
