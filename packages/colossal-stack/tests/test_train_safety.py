"""The training job never overwrites a run it was not told to continue, never moves ``latest``
back, and stops (without saving) when the numbers stop being finite."""

from __future__ import annotations

import json
import math
import re
import shutil

import pytest
import torch
from safetensors.torch import load_file

from colossal import TrainConfig, train
from colossal.booster import HF_INDEX
from colossal.train import NonFiniteError
from colossal_contracts import CapacityError, ConfigError
from colossal_models import GPT
from colossal_zero import consolidate


def _cfg(tmp_path, corpus, **kw):  # type: ignore[no-untyped-def]
    base = dict(preset="nano", steps=4, batch_size=2, seq_len=16, corpus=corpus, lr=3e-3)
    return TrainConfig.from_flags(**{"out": tmp_path / "run", **base, **kw})


def _snapshot(root):  # type: ignore[no-untyped-def]
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_fresh_run_into_an_existing_run_is_refused_and_changes_nothing(tmp_path, small_corpus):
    train(_cfg(tmp_path, small_corpus))
    before = _snapshot(tmp_path / "run")
    with pytest.raises(
        ConfigError, match="pass --resume to continue it, --restart to move it aside"
    ):
        train(_cfg(tmp_path, small_corpus))
    assert _snapshot(tmp_path / "run") == before


def test_resume_of_a_later_checkpoint_with_fewer_steps_is_refused(tmp_path, small_corpus):
    train(_cfg(tmp_path, small_corpus))
    before = _snapshot(tmp_path / "run")
    with pytest.raises(ConfigError, match="at step 4, past --steps 2"):
        train(_cfg(tmp_path, small_corpus, steps=2, resume=True))
    assert _snapshot(tmp_path / "run") == before


def test_resume_of_a_finished_run_saves_nothing(tmp_path, small_corpus):
    train(_cfg(tmp_path, small_corpus))
    before = _snapshot(tmp_path / "run")
    result = train(_cfg(tmp_path, small_corpus, resume=True))
    assert result.losses == [] and result.checkpoint.name == "step-4"
    assert _snapshot(tmp_path / "run") == before


def test_resume_without_a_checkpoint_says_how_to_start(tmp_path, small_corpus):
    with pytest.raises(ConfigError, match=r"holds no run; start a fresh run without --resume"):
        train(_cfg(tmp_path, small_corpus, resume=True))
    assert not (tmp_path / "run").exists()


def test_resume_drops_metrics_of_steps_after_the_checkpoint(tmp_path, small_corpus):
    train(_cfg(tmp_path, small_corpus, steps=4, checkpoint_every=2))
    (tmp_path / "run" / "checkpoint" / "latest").write_text("step-2\n")  # killed after step 4's
    # metrics but before its save, as far as the checkpoint knows
    shutil.rmtree(tmp_path / "run" / "checkpoint" / "step-4")
    train(_cfg(tmp_path, small_corpus, steps=4, resume=True))
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2, 3, 4]


def _poison_forward(monkeypatch, *, at_call: int, factor: float) -> None:
    """From the ``at_call``-th forward on, GPT's loss is multiplied by ``factor``."""
    calls = {"n": 0}
    real = GPT.forward

    def forward(self, idx, targets=None):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        loss = real(self, idx, targets)
        return loss * factor if calls["n"] >= at_call and self.training else loss

    monkeypatch.setattr(GPT, "forward", forward)


@pytest.mark.parametrize("plugin,precision", [("ddp", "fp32"), ("gemini", "bf16")])
def test_nan_loss_stops_at_its_step_and_keeps_the_good_checkpoint(
    tmp_path, small_corpus, monkeypatch, plugin, precision
):
    _poison_forward(monkeypatch, at_call=3, factor=float("nan"))
    cfg = _cfg(tmp_path, small_corpus, plugin=plugin, precision=precision, checkpoint_every=2)
    with pytest.raises(NonFiniteError, match=r"step 3: the loss is nan.*lower --lr"):
        train(cfg)
    ckpt = tmp_path / "run" / "checkpoint"
    assert (ckpt / "latest").read_text().strip() == "step-2"
    assert sorted(p.name for p in ckpt.iterdir()) == ["latest", "step-2"]
    step2 = ckpt / "step-2"
    if plugin == "ddp":  # its checkpoint is the model file
        weights = load_file(str(step2 / "model.safetensors"))
    else:  # an intermediate Gemini checkpoint: the shards, no export (--export final)
        assert not (step2 / HF_INDEX).exists()
        weights = consolidate(step2)
    assert all(torch.isfinite(w).all() for w in weights.values())


def test_fp16_overflowing_every_step_stops_with_the_cause(tmp_path, small_corpus, monkeypatch):
    _poison_forward(monkeypatch, at_call=1, factor=1e30)  # finite loss, fp16 grads overflow
    cfg = _cfg(tmp_path, small_corpus, plugin="gemini", precision="fp16", steps=40)
    with pytest.raises(NonFiniteError, match=r"overflowed in every step since step 1 \(25 steps"):
        train(cfg)
    assert not (tmp_path / "run" / "checkpoint").exists()
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 24 and all(math.isfinite(json.loads(x)["loss"]) for x in lines)


def test_capacity_hint_names_a_budget_that_trains(tmp_path, small_corpus):
    with pytest.raises(CapacityError) as err:
        train(_cfg(tmp_path / "a", small_corpus, accelerator_budget="600000", steps=2))
    assert not (tmp_path / "a" / "run" / "metrics.jsonl").exists()  # failed in step 1: no trace
    # refused right after the warmup (which borrows: [Note: warmup loan]) by the feasibility rule
    assert "feasibility rule" in str(err.value)
    hint = re.search(r"Raise the accelerator budget to at least ([\d,]+) bytes", str(err.value))
    assert hint, str(err.value)
    budget = hint.group(1).replace(",", "")
    result = train(_cfg(tmp_path / "b", small_corpus, accelerator_budget=budget, steps=2))
    assert len(result.losses) == 2
