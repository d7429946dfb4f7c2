"""The table, the PNG timeline and the profile CLI."""

import io
import json
import sys
from pathlib import Path

import pytest
import torch
from rich.console import Console

from colossal_memtrace import MemStats, trace_step
from colossal_memtrace._cli import main
from colossal_memtrace._report import plot_timeline, stats_table

sys.path.insert(0, str(Path(__file__).parent))
from _models_memtrace import TinyLM


def test_table_and_png(tmp_path):
    idx = torch.zeros(2, 8, dtype=torch.long)
    stats = trace_step(TinyLM(), (idx, idx))
    buf = io.StringIO()
    Console(file=buf, width=160).print(stats_table(stats))
    text = buf.getvalue()
    assert "use:wte.weight" in text and "emulated accelerator" in text and "non-model peak" in text
    png = plot_timeline(stats, tmp_path / "t.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_profile_model_factory(tmp_path, capsys):
    sys.path.insert(0, str(Path(__file__).parent))
    rc = main(["profile", "--model", "_models_memtrace:tiny_lm", "--vocab", "64", "--batch", "2",
               "--seq-len", "8", "--out", str(tmp_path)])  # fmt: skip
    assert rc == 0
    out = capsys.readouterr().out
    assert "static estimate / measured peak" in out
    for kind in ("measured", "estimate"):
        stats = MemStats.load(tmp_path / f"memstats-{kind}.json")
        assert stats.num_moments() > 5 and stats.extra["batch"] == 2
        assert (tmp_path / f"timeline-{kind}.png").exists()
    assert (
        json.loads((tmp_path / "memstats-estimate.json").read_text())["source"] == "static-estimate"
    )


@pytest.mark.parametrize(
    "argv,message",
    [
        (["profile", "--model", "no_such_module:f"], "cannot load --model"),
        (["profile", "--model", "nocolon"], "package.module:factory"),
        (["profile", "--model", ":f"], "package.module:factory"),
        (["profile", "--model", "os:sep"], "is not callable"),
        (["profile", "--preset", "tiny"], "colossal profile --preset tiny"),
        (["profile"], "one of the arguments --model"),
        (["profile", "--model", "_models_memtrace:tiny_lm", "--batch", "0"], "--batch must be"),
        (["profile", "--model", "_models_memtrace:tiny_lm", "--batch", "x"], "invalid int"),
        (["profile", "--model", "_models_memtrace:tiny_lm", "--seq-len", "-1"], "--seq-len"),
        (["profile", "--model", "_models_memtrace:tiny_lm", "--vocab", "0"], "--vocab must"),
        (["profile", "--model", "_models_memtrace:tiny_lm", "--mode", "x"], "invalid choice"),
        (["profile", "--model", "_models_memtrace:tiny_lm", "--device", "tpu:0"], "--device"),
        (["profile", "--model", "_models_memtrace:tiny_lm", "--device", "nope"], "--device"),
        (["profile", "--model", "_models_memtrace:tiny_lm", "--optimizer", "lion"], "invalid"),
        (["nope"], "invalid choice"),
        ([], "required"),
    ],
)
def test_cli_bad_arguments_are_one_line_and_exit_2(argv, message, tmp_path, capsys):
    assert main([*argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err


def test_cli_out_that_is_a_file(tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    argv = ["profile", "--model", "_models_memtrace:tiny_lm", "--out", str(tmp_path / "f")]
    assert main(argv) == 2
    assert "is a file" in capsys.readouterr().err
    assert (tmp_path / "f").read_text() == "x"
