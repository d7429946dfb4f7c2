"""One run per --out ([Note: run lock]), ranks that die with their launcher ([Note: parent-death
signal]) and runs stopped by a signal ([Note: stopping a run])."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from colossal._lifeline import LAUNCHER_ENV, RunStopped, stop_on_signals
from colossal.cli import main
from colossal.train._outdir import claim_out
from colossal.train._runlock import LOCK_FILE, RunLock
from colossal_contracts import ConfigError

_HOLD = textwrap.dedent(
    """
    import sys, time
    from colossal.train._runlock import RunLock
    RunLock(sys.argv[1]).acquire()
    print("held", flush=True)
    time.sleep(600)
    """
)


def _holder(out: Path) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(out)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_second_run_is_refused_with_the_holders_pid_until_it_dies(tmp_path, capsys):
    out = tmp_path / "run"
    holder = _holder(out)
    try:
        with pytest.raises(
            ConfigError, match=f"in use by a running colossal job \\(pid {holder.pid}\\)"
        ):
            RunLock(out).acquire()
        argv = ["train", "--preset", "nano", "--steps", "1", "--out", str(out)]
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"pid {holder.pid}" in err[0], err
        assert main([*argv, "--resume"]) == 2  # a resume while it lives: refused the same way
        assert f"pid {holder.pid}" in capsys.readouterr().err
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    lock = RunLock(out)  # the kernel released the dead holder's lock: no stale lock
    lock.acquire()
    assert (out / LOCK_FILE).read_text().strip() == str(os.getpid())
    lock.release()
    assert (out / LOCK_FILE).read_text() == ""


def test_refused_claim_leaves_no_folder_behind(tmp_path):
    out = tmp_path / "fresh"
    with pytest.raises(ConfigError, match="holds no run"):
        claim_out(out, resume=True, restart=False)
    assert not out.exists()
    with pytest.raises(ConfigError, match="exclude each other"):
        claim_out(out, resume=True, restart=True)


def test_restart_moves_the_old_run_aside_and_keeps_it(tmp_path):
    out = tmp_path / "run"
    (out / "checkpoint" / "step-1").mkdir(parents=True)  # killed in its first save: no manifest
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(
        ConfigError, match=r"no usable checkpoint .*manifest\.json is missing.*--restart"
    ):
        claim_out(out, resume=True, restart=False)
    with pytest.raises(ConfigError, match="--restart to move it aside"):
        claim_out(out, resume=False, restart=False)
    claim = claim_out(out, resume=False, restart=True)
    try:
        assert claim.moved_aside == tmp_path / "run.old-1" and claim.resume_from is None
        assert (claim.moved_aside / "metrics.jsonl").read_text() == '{"step": 1}\n'
        assert (claim.moved_aside / "checkpoint" / "step-1").is_dir()
        assert sorted(p.name for p in out.iterdir()) == [LOCK_FILE]
    finally:
        claim.lock.release()


_LAUNCHER = textwrap.dedent(
    """
    import os, subprocess, sys, time
    env = dict(os.environ, {env}=str(os.getpid()))
    child = ("from colossal._lifeline import die_with_launcher; import time; "
             "print(die_with_launcher(), flush=True); time.sleep(600)")
    proc = subprocess.Popen([sys.executable, "-c", child], env=env, stdout=subprocess.PIPE, text=True)
    print(proc.pid, proc.stdout.readline().strip(), flush=True)
    time.sleep(600)
    """
).format(env=LAUNCHER_ENV)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_rank_dies_with_its_launcher():
    launcher = subprocess.Popen(
        [sys.executable, "-c", _LAUNCHER], stdout=subprocess.PIPE, text=True
    )
    assert launcher.stdout is not None
    pid, armed = launcher.stdout.readline().split()
    rank = psutil.Process(int(pid))
    assert armed == "True"
    launcher.send_signal(signal.SIGKILL)
    launcher.wait()
    try:
        rank.wait(timeout=30)  # a guard only: the kernel kills it at once
    except psutil.TimeoutExpired:
        rank.kill()
        pytest.fail("the rank outlived its launcher")


def test_sigterm_and_sigint_stop_the_run_with_one_line():
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    for sig in (signal.SIGTERM, signal.SIGINT):
        stopped = pytest.raises(RunStopped, match=f"stopped by {sig.name}.*--resume")
        with stopped, stop_on_signals(0, 1):
            os.kill(os.getpid(), sig)
            time.sleep(30)  # interrupted by the handler; a guard only
    assert {s: signal.getsignal(s) for s in before} == before
