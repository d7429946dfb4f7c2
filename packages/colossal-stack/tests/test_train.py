import json

import pytest
import torch

from colossal import TrainConfig, train
from colossal.booster import HF_INDEX
from colossal_contracts import ConfigError


def _cfg(tmp_path, corpus, **kw):
    base = dict(
        preset="nano",
        steps=30,
        batch_size=8,
        seq_len=32,
        corpus=corpus,
        out=tmp_path / "run",
        lr=3e-3,
    )
    return TrainConfig.from_flags(**{**base, **kw})


def test_loss_falls_and_outputs_are_written(tmp_path, small_corpus):
    result = train(_cfg(tmp_path, small_corpus))
    assert len(result.losses) == 30
    assert result.losses[-1] < result.losses[0] - 1.0  # from ~ln(256)=5.5 to well below
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == list(range(1, 31))
    assert {"step", "loss", "tokens_per_s"} <= set(lines[0])
    assert result.checkpoint == tmp_path / "run" / "checkpoint" / "step-30"
    assert (result.checkpoint / HF_INDEX).is_file()  # --export final: the last checkpoint


def test_resume_continues_with_the_same_losses(tmp_path, small_corpus):
    full = train(_cfg(tmp_path / "a", small_corpus, steps=12))
    train(_cfg(tmp_path / "b", small_corpus, steps=12, checkpoint_every=6))
    # pretend the second run stopped at step 6: point latest back and resume
    ckpt = tmp_path / "b" / "run" / "checkpoint"
    assert not (ckpt / "step-6" / HF_INDEX).exists()  # only the final save exports
    assert (ckpt / "step-12" / HF_INDEX).is_file()
    (ckpt / "latest").write_text("step-6\n")
    resumed = train(_cfg(tmp_path / "b", small_corpus, steps=12, resume=True))
    assert resumed.losses == pytest.approx(full.losses[6:], rel=1e-6)


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"steps": 0}, "--steps must be positive"),
        ({"batch_size": -1}, "--batch-size must be positive"),
        ({"model": "bert"}, "unknown --model 'bert'"),
    ],
)
def test_bad_config_is_a_clear_error(tmp_path, kw, match):
    with pytest.raises(ConfigError, match=match):
        TrainConfig.from_flags(**kw)


def test_sequence_longer_than_context_is_rejected_before_training(tmp_path, small_corpus):
    with pytest.raises(ConfigError, match="exceeds gpt-nano's context"):
        train(_cfg(tmp_path, small_corpus, seq_len=65))


def test_unknown_plugin(tmp_path, small_corpus):
    with pytest.raises(ConfigError, match="unknown --plugin 'zero9'"):
        train(_cfg(tmp_path, small_corpus, plugin="zero9"))


def test_same_seed_same_losses(tmp_path, small_corpus):
    a = train(_cfg(tmp_path / "a", small_corpus, steps=3))
    b = train(_cfg(tmp_path / "b", small_corpus, steps=3))
    assert a.losses == b.losses
    assert torch.isfinite(torch.tensor(a.losses)).all()
