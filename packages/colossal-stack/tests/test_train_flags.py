"""Training-job flags: ``--grad-accum N`` equals the N-times batch (fp32: losses within 1e-6,
final weights within 1e-5 but for the key bias: Adam divides by the root of the squared
gradient, so an element whose gradient is zero in exact arithmetic (the key bias: softmax ignores
a per-query constant) turns summation-order rounding into update differences up to ~3e-4) under Gemini, ZeRO-2 and DDP in one process and under the hybrid plugin
(tp 2; pp 2, where accumulation is more micro-batches) on 2 ranks; ``--weight-decay`` decays
matrices only and every plugin keeps the two groups, the hybrid plugin and Gemini with tp
included (a run with weight decay 1 and lr 1e-2 against single-process AdamW with the
groups: norm weights within 1e-5, where one decayed group would put them ~1e-2 off; the others
within 5e-4, tp's summation order grown by Adam); ``--activation-checkpointing`` under Gemini (GPT, and an HF model through its own
switch) gives the losses without it; ``--eval-every`` records validation losses, the pipelined
one computed forward only; ``--log tensorboard`` writes the conventional scalars. Rank side in
``_checks_train_flags.py``."""

from __future__ import annotations

import pytest
import torch
from _checks_train_flags import final_weights, run_all
from _checks_train_mesh import reference_run

from colossal import TrainConfig, train
from colossal.cli import main
from colossal.train._step import _param_groups
from colossal_models import GPT, GPTConfig

BASE = {"preset": "nano", "steps": 3, "seq_len": 16}


def _close(a: dict, b: dict, tol: float) -> None:
    """Every weight within ``tol``, except GPT's key bias (the middle third of ``qkv.bias``):
    its gradient is zero in exact arithmetic, so Adam turns rounding into steps of up to ~3e-4
    (measured against plain AdamW at lr 1e-2); it is left out."""
    assert a.keys() == b.keys()
    worst = {}
    for k in a:
        x, y = a[k], b[k]
        if k.endswith("attn.qkv.bias"):
            third = x.numel() // 3
            x, y = torch.cat([x[:third], x[2 * third :]]), torch.cat([y[:third], y[2 * third :]])
        worst[k] = (x - y).abs().max().item()
    assert max(worst.values()) <= tol, {k: f"{v:.1e}" for k, v in worst.items() if v > tol}


@pytest.mark.parametrize(
    "plugin", [{"plugin": "gemini"}, {"plugin": "zero", "zero_stage": 2}, {"plugin": "ddp"}]
)
def test_grad_accum_equals_the_n_times_batch_on_one_rank(tmp_path, small_corpus, plugin):
    kw = {**BASE, **plugin, "corpus": small_corpus}
    whole = train(TrainConfig.from_flags(**kw, batch_size=4, out=tmp_path / "whole"))
    accum = train(TrainConfig.from_flags(**kw, batch_size=2, grad_accum=2, out=tmp_path / "accum"))
    for a, b in zip(whole.losses, accum.losses, strict=True):
        assert abs(a - b) <= 1e-6, (whole.losses, accum.losses)
    _close(final_weights(tmp_path / "whole"), final_weights(tmp_path / "accum"), 1e-5)


def test_hybrid_accumulation_and_groups_on_two_ranks(world, tmp_path, small_corpus):
    kw = {**BASE, "corpus": small_corpus}
    decay = {"weight_decay": 1.0, "lr": 1e-2, "batch_size": 2}
    runs = {
        "tp2": {**kw, "tp": 2, "batch_size": 4},
        "tp2-accum": {**kw, "tp": 2, "batch_size": 2, "grad_accum": 2},
        "pp2": {**kw, "pp": 2, "microbatches": 2, "batch_size": 4, "eval_every": 3},
        "pp2-accum": {**kw, "pp": 2, "microbatches": 2, "batch_size": 2, "grad_accum": 2},
        "tp2-decay": {**kw, "tp": 2, **decay},
        "gemini-tp2-decay": {**kw, "plugin": "gemini", "tp": 2, **decay},
    }
    runs = {n: {**r, "out": tmp_path / n} for n, r in runs.items()}
    got = dict(zip(runs, world(2).run(run_all, list(runs.values()))[0], strict=True))
    for whole, accum in (("tp2", "tp2-accum"), ("pp2", "pp2-accum")):
        for a, b in zip(got[whole]["losses"], got[accum]["losses"], strict=True):
            assert abs(a - b) <= 1e-6, (whole, got[whole]["losses"], got[accum]["losses"])
        _close(got[whole]["weights"], got[accum]["weights"], 1e-5)
    # the pipelined validation loss (forward only) is the loss of the final weights
    model = GPT(GPTConfig.preset("nano"))
    model.load_state_dict(got["pp2"]["weights"])
    assert got["pp2"]["val_loss"] == pytest.approx(_val_loss(model, runs["pp2"]), abs=1e-5)
    for name in ("tp2-decay", "gemini-tp2-decay"):
        ref = {k: v for k, v in runs[name].items() if k in (*BASE, "corpus", "lr", "batch_size")}
        _, weights = reference_run({**ref, "weight_decay": 1.0}, 1)
        # norm weights (~1, undecayed) pin the groups: decayed, they would be ~1e-2 off; the
        # rest differ by tp's summation order, grown by Adam at lr 1e-2 (up to 1e-4 measured)
        norms = [k for k in weights if ".ln" in k or k.startswith("ln_f")]
        _close({k: got[name]["weights"][k] for k in norms}, {k: weights[k] for k in norms}, 1e-5)
        _close(got[name]["weights"], weights, 5e-4)


def _val_loss(model: torch.nn.Module, kw: dict) -> float:
    """The loop's held-out batches (the loader's first four) through ``model``, forward only."""
    from colossal.train._data import open_data, open_loader, resolve_tokenizer

    cfg = TrainConfig.from_flags(**{k: v for k, v in kw.items() if k != "eval_every"})
    tokenizer = resolve_tokenizer(cfg)
    batches = open_loader(cfg, open_data(cfg, tokenizer, rank=0)).val_batches(4)
    with torch.no_grad():
        return sum(model.eval()(x, y).item() for x, y in batches) / len(batches)


def test_weight_decay_skips_biases_and_norm_weights():
    model = GPT(GPTConfig.preset("nano"))
    decay, other = _param_groups(model, 0.3)
    names = {id(p): n for n, p in model.named_parameters()}
    assert decay["weight_decay"] == 0.3 and other["weight_decay"] == 0.0
    assert {names[id(p)] for p in other["params"]} == {
        n for n, _ in model.named_parameters() if n.endswith("bias") or ".ln" in n or "ln_f" in n
    }
    assert "wte.weight" in {names[id(p)] for p in decay["params"]}


def test_activation_checkpointing_under_gemini_keeps_the_losses(tmp_path, small_corpus):
    pytest.importorskip("transformers")
    from _checks_export import write_gpt2_folder

    folder = write_gpt2_folder(tmp_path / "gpt2", "def f(x):\n    return x\n" * 50)
    for model in ("gpt", f"hf:{folder}"):
        kw = {**BASE, "model": model, "batch_size": 2, "corpus": small_corpus}
        plain = train(TrainConfig.from_flags(**kw, out=tmp_path / f"plain-{len(model)}"))
        ckpt = TrainConfig.from_flags(
            **kw, activation_checkpointing=True, out=tmp_path / f"ac-{len(model)}"
        )
        again = train(ckpt)
        for a, b in zip(plain.losses, again.losses, strict=True):
            assert abs(a - b) <= 1e-6, (model, plain.losses, again.losses)


def test_eval_every_and_tensorboard(tmp_path, small_corpus):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    argv = ["train", "--preset", "nano", "--steps", "4", "--batch-size", "2", "--seq-len", "16"]
    argv += ["--corpus", str(small_corpus), "--eval-every", "2", "--log", "tensorboard"]
    assert main([*argv, "--out", str(tmp_path / "run")]) == 0
    import json

    records = [
        json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().split("\n") if x
    ]
    assert [("val_loss" in r) for r in records] == [False, True, False, True]
    events = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"train/loss", "train/lr", "val/loss", "perf/tokens_per_s"} <= tags
    assert [e.value for e in events.Scalars("train/loss")] == pytest.approx(
        [r["loss"] for r in records]
    )
    assert main([*argv[:-2], "--log", "wandb", "--out", str(tmp_path / "bad")]) == 2
