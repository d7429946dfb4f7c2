"""`colossal train --model palm --preset tiny` learns on the embedded default corpus, under the
default plugin (Gemini)."""

import json
import subprocess
import sys


def _train(tmp_path, *extra):
    """12 steps: the loss is below 4 from step 5-7 on (measured: 5.33 -> 2.92 at step 12; more
    steps add nothing the assertions read but time)."""
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "colossal", "train", "--model", "palm", "--preset", "tiny",
         "--steps", "12", "--batch-size", "8", "--seq-len", "64", "--out", str(out), *extra],
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
    assert len(losses) == 12
    assert losses[-1] < losses[0] - 1.5, losses  # ~5.5 (uniform over bytes) to well below 4
    assert "palm-tiny" in proc.stderr
    # the default plugin is Gemini: this one run is also the PaLM-under-Gemini check (a second
    # test passed --plugin gemini and trained the same 40 steps again)
    assert "plugin gemini" in " ".join(proc.stderr.split())
