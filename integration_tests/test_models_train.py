"""`colossal train --model palm --preset tiny` learns on the embedded default corpus."""

import json
import subprocess
import sys

import pytest


def _train(tmp_path, *extra):
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "colossal", "train", "--model", "palm", "--preset", "tiny",
         "--steps", "40", "--batch-size", "8", "--seq-len", "64", "--out", str(out), *extra],
        capture_output=True,
        text=True,
        timeout=900,
    )  # fmt: skip
    return proc, out


def _losses(out):
    return [json.loads(x)["loss"] for x in (out / "metrics.jsonl").read_text().splitlines()]


def test_palm_tiny_learns_on_the_default_corpus(tmp_path):
    proc, out = _train(tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    losses = _losses(out)
    assert len(losses) == 40
    assert losses[-1] < losses[0] - 1.5, losses  # ~5.5 (uniform over bytes) to well below 4
    assert "palm-tiny" in proc.stderr


def test_palm_tiny_learns_with_the_gemini_plugin(tmp_path):
    from colossal.train import build_plugin
    from colossal_contracts import ConfigError

    try:
        build_plugin("gemini")
    except ConfigError:
        pytest.skip("the Booster's Gemini plugin is not there yet")
    proc, out = _train(tmp_path, "--plugin", "gemini")
    assert proc.returncode == 0, proc.stderr[-3000:]
    losses = _losses(out)
    assert losses[-1] < losses[0] - 1.5, losses
