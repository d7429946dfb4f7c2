import json
import subprocess
import sys

import pytest

from colossal.cli import main
from colossal.cli._run import split_argv
from colossal_contracts import ConfigError


@pytest.mark.parametrize(
    "argv,message",
    [
        (["train", "--preset", "huge"], "unknown GPT preset 'huge'"),
        (["train", "--steps", "0"], "--steps must be positive"),
        (["train", "--steps", "-3"], "--steps must be positive"),
        (["train", "--corpus", "/definitely/not/here"], "does not exist"),
        (["train", "--plugin", "nope"], "unknown --plugin 'nope'"),
        (["train", "--export", "all"], "unknown --export 'all'; choose one of: final, every"),
        (["train", "--plugin", "ddp", "--export", "every"], "--export every applies to the"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys, tmp_path):
    assert main([*argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err
    assert "Traceback" not in err and len(err.splitlines()) == 1


def test_empty_corpus_folder(capsys, tmp_path):
    (tmp_path / "c").mkdir()
    assert main(["train", "--corpus", str(tmp_path / "c"), "--out", str(tmp_path / "o")]) == 2
    assert "holds no text" in capsys.readouterr().err


def test_check_prints_torch_and_backends(capsys):
    assert main(["check"]) == 0
    out = capsys.readouterr().out
    assert "torch" in out and "gloo" in out


def test_run_splits_torchrun_flags_from_the_command():
    assert split_argv(["--nproc-per-node", "2", "train", "--steps", "3"]) == (
        ["--nproc-per-node", "2"],
        ["train", "--steps", "3"],
    )
    assert split_argv(["--nnodes", "1", "x.py", "a"]) == (["--nnodes", "1"], ["x.py", "a"])
    with pytest.raises(ConfigError, match="nothing to launch"):
        split_argv(["--nproc-per-node", "2"])


@pytest.mark.slow
def test_train_under_colossal_run_on_two_processes(tmp_path, small_corpus):
    """One launch (each costs two interpreters importing the stack) checks ``colossal run`` with
    ``train`` on a tp2 x zero1 mesh: the metrics are written once, by rank 0, the run line counts
    both ranks, and every step records the mesh the hybrid plugin built."""
    out = tmp_path / "run"
    argv = ["--preset", "nano", "--steps", "3", "--batch-size", "2", "--seq-len", "16"]
    proc = subprocess.run(
        [sys.executable, "-m", "colossal", "run", "--nproc-per-node", "2", "train",
         "--tp", "2", "--zero", "1", *argv, "--corpus", str(small_corpus), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]  # written once, by rank 0
    assert [r["mesh"] for r in records] == ["dp1 x tp2(1d), zero1"] * 3
    err = " ".join(proc.stderr.split())
    assert "2 x 2 x 16" in err  # ranks x batch x seq
    assert "hybrid (dp1 x tp2(1d), zero1)" in err


def test_profile_a_preset(tmp_path, capsys):
    argv = ["profile", "--preset", "nano", "--batch", "2", "--seq-len", "16"]
    assert main([*argv, "--mode", "estimate", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "memstats-estimate.json").is_file()
    assert "gpt-nano" in (tmp_path / "memstats-estimate.json").read_text()
