"""--no-final-save (TrainConfig.save_final=False): a run that keeps no checkpoint when it ends,
for runs whose disk tier fills the disk; the --checkpoint-every saves stay."""

from __future__ import annotations

import pytest

from colossal import TrainConfig, train
from colossal.cli import main
from colossal_contracts import ConfigError


def _cfg(tmp_path, corpus, **kw):
    base = dict(
        preset="nano", steps=3, batch_size=4, seq_len=32, corpus=corpus, out=tmp_path / "run"
    )
    return TrainConfig.from_flags(**{**base, **kw})


def test_no_checkpoint_when_the_run_ends(tmp_path, small_corpus):
    result = train(_cfg(tmp_path, small_corpus, save_final=False, export="none"))
    assert len(result.losses) == 3 and result.checkpoint is None
    assert not (tmp_path / "run" / "checkpoint").exists()
    assert (tmp_path / "run" / "metrics.jsonl").is_file()


def test_periodic_saves_stay(tmp_path, small_corpus):
    cfg = _cfg(tmp_path, small_corpus, checkpoint_every=2, save_final=False, export="none")
    result = train(cfg)
    saved = sorted(p.name for p in (tmp_path / "run" / "checkpoint").glob("step-*"))
    assert saved == ["step-2"] and result.checkpoint is not None
    assert result.checkpoint.name == "step-2"


@pytest.mark.parametrize("export", ["final", "merged"])
def test_an_export_of_the_final_checkpoint_is_refused(export):
    with pytest.raises(
        ConfigError, match=f"--no-final-save leaves no final checkpoint for --export {export}"
    ):
        TrainConfig.from_flags(save_final=False, export=export)


def test_the_flag_reaches_the_config(tmp_path, capsys, small_corpus):
    out = tmp_path / "run"
    argv = ["train", "--preset", "nano", "--steps", "1", "--batch-size", "2", "--seq-len", "32"]
    argv += ["--data", str(small_corpus), "--out", str(out), "--no-final-save"]
    assert main(argv) == 2  # --export final by default: one line, nothing written
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--export none" in err and not out.exists()
    assert main([*argv, "--export", "none"]) == 0
    assert (out / "metrics.jsonl").is_file() and not (out / "checkpoint").exists()
