"""A rank that dies makes the survivors stop with one line naming it (not a socket traceback,
not a hang), under the plain ``env://`` launch and under ``colossal run``'s report."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from colossal.cli._run import _describe


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_survivor_names_the_dead_rank(tmp_path, small_corpus):
    out, port = tmp_path / "run", str(_free_port())
    argv = [sys.executable, "-m", "colossal", "train", "--preset", "nano", "--steps", "2000",
            "--batch-size", "2", "--seq-len", "16", "--corpus", str(small_corpus),
            "--out", str(out), "--plugin", "ddp"]  # fmt: skip
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
                   LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=port)  # fmt: skip
        procs.append(subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True))
    try:
        metrics = out / "metrics.jsonl"
        for _ in range(3000):  # both ranks are past their first steps
            if metrics.exists() and len(metrics.read_text().splitlines()) >= 3:
                break
            assert procs[0].poll() is None, procs[0].communicate()[1][-2000:]
            time.sleep(0.1)
        os.kill(procs[1].pid, signal.SIGKILL)
        _, err = procs[0].communicate(timeout=120)  # a hang fails here, not after 30 minutes
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    assert procs[0].returncode == 1, err[-2000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: rank 1 died") and "rank 0 stops too" in last, err[-2000:]
    assert "Traceback" not in err


def test_colossal_run_names_the_rank_that_died_first():
    f = lambda code, sig: SimpleNamespace(exitcode=code, signal_name=lambda: sig)  # noqa: E731
    text = _describe({0: f(1, ""), 1: f(-9, "SIGKILL"), 2: f(-15, "SIGTERM")})
    assert text == "rank 1 (killed by SIGKILL) failed first; rank 0, 2 stopped after it"
    assert _describe({3: f(2, "")}) == "rank 3 (exit status 2) failed first"
