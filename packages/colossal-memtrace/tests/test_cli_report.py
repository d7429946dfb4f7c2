"""The table, the PNG timeline and the profile CLI."""

import io
import json
import sys
from pathlib import Path

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


def test_cli_errors_are_plain(tmp_path, capsys):
    assert main(["profile", "--model", "no_such_module:f", "--out", str(tmp_path)]) == 2
    assert "cannot load --model" in capsys.readouterr().out
    assert main(["profile", "--model", "nocolon", "--out", str(tmp_path)]) == 2
    assert "package.module:factory" in capsys.readouterr().out
