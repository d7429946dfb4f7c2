"""LoRA through ``colossal train --lora-rank``: the job equals plain ``peft`` with
``torch.optim.AdamW`` on one process (losses and adapters within 1e-6, fp32, 5 steps) under
ddp, ZeRO-2 and Gemini, on our GPT and a tiny Hugging Face GPT-2 (also under the hybrid
plugin, which trains it as our GPT); its exports load with
``peft`` (same logits) and ``transformers``; checkpoints hold the adapters and their optimizer
state, not the base; a resume is exact, one on other base weights is refused."""

from __future__ import annotations

import json

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import load_file

from colossal import TrainConfig, train
from colossal.train._data import open_data, open_loader, resolve_tokenizer
from colossal.train._models import resolve_model
from colossal.train._schedule import warmup_cosine
from colossal_contracts import CheckpointError
from colossal_models import GPT, GPTConfig
from colossal_models.hf import HFCausalLM

STEPS = 5
GPT_TARGETS = ["attn.qkv", "attn.proj", "mlp.fc", "mlp.proj"]
GPT2_TARGETS = ["c_attn", "attn.c_proj", "c_fc", "mlp.c_proj"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):  # type: ignore[no-untyped-def]
    from colossal_models import default_corpus_path

    folder = tmp_path_factory.mktemp("lora-corpus")
    (folder / "a.py").write_bytes((default_corpus_path() / "argparse.py").read_bytes())
    return folder


@pytest.fixture(scope="module")
def gpt2_folder(tmp_path_factory):  # type: ignore[no-untyped-def]
    import transformers

    folder = tmp_path_factory.mktemp("lora-gpt2")
    transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=256, n_positions=64, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0,
    ).save_pretrained(folder)  # fmt: skip
    return folder


def _cfg(out, corpus, model="gpt", **kw):  # type: ignore[no-untyped-def]
    base = dict(
        model=model, preset="nano", steps=STEPS, batch_size=2, seq_len=16, data=corpus,
        out=out, lora_rank=4, lora_alpha=8.0, val_fraction=0.0, weight_decay=0.1,
    )  # fmt: skip
    return TrainConfig.from_flags(**{**base, **kw})  # type: ignore[arg-type]


def _reference(cfg: TrainConfig, targets: list[str]):  # type: ignore[no-untyped-def]
    """Plain peft on the job's model and batches, torch AdamW with the job's schedule."""
    tokenizer = resolve_tokenizer(cfg)
    loader = open_loader(cfg, open_data(cfg, tokenizer, rank=0))
    spec = resolve_model(cfg.model.name, cfg.model.preset, vocab_size=tokenizer.vocab_size)
    torch.manual_seed(cfg.training.seed)
    model = spec.build()
    lora = LoraConfig(r=4, lora_alpha=8.0, target_modules=targets, lora_dropout=0.0)
    if isinstance(model, HFCausalLM):
        model.hf = get_peft_model(model.hf, lora)
        peft_part = model.hf
    else:
        model = peft_part = get_peft_model(model, lora)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.training.lr, betas=(0.9, 0.95), weight_decay=0.1)
    losses = []
    for step in range(cfg.training.steps):
        for g in opt.param_groups:
            g["lr"] = cfg.training.lr * warmup_cosine(step, cfg.training.steps)
        x, y = loader.next_batch()
        loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, model, peft_part


def _adapters(folder) -> dict[str, torch.Tensor]:  # type: ignore[no-untyped-def]
    return load_file(str(folder / "adapter_model.safetensors"))


CASES = [  # (id, model, settings)
    ("gpt-ddp", "gpt", {"plugin": "ddp"}),
    ("gpt-zero2", "gpt", {"plugin": "zero", "zero_stage": 2}),
    ("gpt-gemini", "gpt", {"plugin": "gemini"}),
    ("gpt2-zero2", "hf", {"plugin": "zero", "zero_stage": 2}),
    ("gpt2-gemini", "hf", {"plugin": "gemini"}),
    ("gpt2-hybrid-zero1", "hf", {"plugin": "hybrid", "zero_stage": 1}),  # trained as our GPT
]


@pytest.mark.parametrize("model,kw", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_lora_job_equals_plain_peft(tmp_path, corpus, gpt2_folder, model, kw):
    name, targets = ("gpt", GPT_TARGETS) if model == "gpt" else (f"hf:{gpt2_folder}", GPT2_TARGETS)
    cfg = _cfg(tmp_path / "run", corpus, model=name, **kw)
    result = train(cfg)
    ref_losses, _, ref_peft = _reference(cfg, targets)
    assert result.losses == pytest.approx(ref_losses, abs=1e-6, rel=0)
    ref_peft.save_pretrained(str(tmp_path / "ref-adapter"), save_embedding_layers=False)
    ours, ref = _adapters(tmp_path / "run" / "adapter"), _adapters(tmp_path / "ref-adapter")
    assert sorted(ours) == sorted(ref) and len(ours) == 16  # 2 blocks x 4 layers x (A, B)
    for k in ref:
        torch.testing.assert_close(ours[k], ref[k], atol=1e-6, rtol=0)
    trainer = json.loads((tmp_path / "run/checkpoint/step-5/trainer.json").read_text())
    assert trainer["lora"]["targets"] == ["attn", "mlp"]
    assert trainer["lora"]["trainable_params"] == sum(v.numel() for v in ref.values())


@pytest.mark.parametrize(
    "kw",
    [{"plugin": "zero", "zero_stage": 2}, {"plugin": "hybrid"}],
    ids=["zero2", "hybrid"],  # hybrid: trained as our GPT, adapters under HF names
)
def test_adapter_and_merged_exports_load(tmp_path, corpus, gpt2_folder, kw):
    """hf: GPT-2 (a saved folder) under ZeRO-2 or the hybrid plugin with --export merged:
    out/adapter loads with peft onto the base and gives the job's logits; out/hf (merged) loads
    with transformers and gives them too; generate on the base folder with --adapter equals
    generate on out/hf."""
    import transformers

    from colossal import generate

    torch.manual_seed(0)
    base_dir = tmp_path / "base"
    transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.from_pretrained(gpt2_folder)
    ).save_pretrained(base_dir)
    cfg = _cfg(tmp_path / "run", corpus, model=f"hf:{base_dir}", **kw)
    train(cfg.replace(export="merged", steps=3))
    _, trained, _ = _reference(cfg.replace(steps=3), GPT2_TARGETS)
    x = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(1))
    want = trained.eval()(x).detach()
    base = transformers.AutoModelForCausalLM.from_pretrained(base_dir)
    with_adapter = PeftModel.from_pretrained(base, str(tmp_path / "run" / "adapter")).eval()
    torch.testing.assert_close(with_adapter(input_ids=x).logits, want, atol=1e-5, rtol=0)
    merged = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "hf").eval()
    torch.testing.assert_close(merged(input_ids=x).logits, want, atol=1e-5, rtol=0)
    a = generate(base_dir, "def ", max_new_tokens=6, adapter=tmp_path / "run" / "adapter")
    b = generate(tmp_path / "run" / "hf", "def ", max_new_tokens=6)
    assert a.new_ids == b.new_ids and len(a.new_ids) == 6


def test_native_gpt_adapter_and_generate(tmp_path, corpus):
    """Our GPT: the adapter folder loads with peft onto GPT; colossal generate runs from the
    LoRA run (base + adapters merged) and from the merged export with the same text."""
    from colossal import generate
    from colossal.export import export_hf

    cfg = _cfg(tmp_path / "run", corpus, plugin="ddp", steps=3)
    train(cfg)
    _, trained, _ = _reference(cfg, GPT_TARGETS)
    torch.manual_seed(cfg.training.seed)
    base = GPT(GPTConfig.preset("nano").with_vocab(256))
    loaded = PeftModel.from_pretrained(base, str(tmp_path / "run" / "adapter")).eval()
    x = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(loaded(x), trained.eval()(x), atol=1e-5, rtol=0)
    export_hf(tmp_path / "run", tmp_path / "merged")
    a = generate(tmp_path / "run", "def ", max_new_tokens=8)
    b = generate(tmp_path / "merged", "def ", max_new_tokens=8)
    assert a.new_ids == b.new_ids and len(a.new_ids) == 8


def _checkpoint_weight_bytes(step) -> int:  # type: ignore[no-untyped-def]
    return sum(f.stat().st_size for f in step.glob("*.safetensors"))


@pytest.mark.parametrize(
    "kw",
    [
        {"plugin": "zero", "zero_stage": 2},
        {"plugin": "gemini"},
        {"plugin": "ddp"},
        {"plugin": "hybrid", "zero_stage": 1},
    ],
    ids=["zero2", "gemini", "ddp", "hybrid-zero1"],
)
def test_lora_resume_exact_and_other_base_refused(tmp_path, corpus, kw):
    """A LoRA checkpoint holds the adapters and their Adam state, not the base (12 bytes per
    adapter parameter: value and two moments, plus the files' headers, against 4 per base
    parameter for one fp32 copy of the base); the resume rebuilds the base from its source
    and continues the uninterrupted losses exactly; on other base weights it is refused."""
    kw = dict(kw, checkpoint_every=3, steps=6, export="none")
    full = train(_cfg(tmp_path / "full", corpus, **kw))
    cut = tmp_path / "cut"
    train(_cfg(cut, corpus, **kw))
    step3 = cut / "checkpoint" / "step-3"
    adapters = json.loads((step3 / "trainer.json").read_text())["lora"]["trainable_params"]
    base = GPTConfig.preset("nano").with_vocab(256).num_params()
    weights = _checkpoint_weight_bytes(step3)
    assert 12 * adapters <= weights <= 12 * adapters + 16 * 1024 < base  # base fp32: 4 * base
    (cut / "checkpoint" / "latest").write_text("step-3\n")
    resumed = train(_cfg(cut, corpus, resume=True, **kw))
    assert resumed.losses == full.losses[3:]
    if kw["plugin"] != "zero":
        return
    before = sorted(p.name for p in (cut / "checkpoint").iterdir())
    with pytest.raises(CheckpointError, match="base weights differ") as err:
        train(_cfg(cut, corpus, resume=True, seed=1, **{**kw, "steps": 7}))
    assert "\n" not in str(err.value)
    assert sorted(p.name for p in (cut / "checkpoint").iterdir()) == before


@pytest.mark.parametrize(
    "saved,resumed",
    [
        ({"plugin": "zero", "zero_stage": 2}, {"plugin": "hybrid", "zero_stage": 1}),
        ({"plugin": "hybrid"}, {"plugin": "zero", "zero_stage": 2}),
    ],
    ids=["zero2-to-hybrid", "hybrid-to-zero2"],
)
def test_lora_checkpoint_resumes_under_another_plugin(tmp_path, corpus, saved, resumed):
    """A LoRA checkpoint without its base (Gemini/ZeRO's index or the hybrid plugin's layout
    index name it ``frozen_omitted``) resumes under another plugin, the base rebuilt from its
    source, and continues the uninterrupted losses exactly."""
    import shutil

    kw = dict(checkpoint_every=3, steps=5, export="none")
    full = train(_cfg(tmp_path / "full", corpus, **saved, **kw))
    (tmp_path / "full" / "checkpoint" / "latest").write_text("step-3\n")
    shutil.copytree(tmp_path / "full", tmp_path / "cut")
    again = train(_cfg(tmp_path / "cut", corpus, resume=True, **resumed, **kw))
    assert again.losses == full.losses[3:]
