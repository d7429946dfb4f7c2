"""Fault trials of whole runs, for ``bench_faults``: two runs into one ``--out`` at once, a
launcher killed with SIGKILL, a rank frozen with SIGSTOP, and clean multi-rank runs counted for
aborts at exit ([Note: run lock], [Note: parent-death signal], [Note: watchdog], [Note: clean
exit] in the stack)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from colossal.checkpoint._publish import verify_manifest
from colossal.train._runlock import RunLock
from colossal_contracts import ColossalError

SMALL = ["--preset", "nano", "--batch-size", "2", "--seq-len", "16"]


def _colossal(*args: str) -> list[str]:
    return [sys.executable, "-m", "colossal", *args]


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def _lines(path: Path) -> int:
    try:
        return len(path.read_text().splitlines())
    except OSError:
        return 0


def _wait_for(cond: Any, proc: subprocess.Popen, limit_s: float = 300) -> bool:
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s and proc.poll() is None:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def _ranks(launcher: subprocess.Popen) -> list[psutil.Process]:
    out = []
    for c in psutil.Process(launcher.pid).children(recursive=True):
        try:
            if "RANK" in c.environ():
                out.append(c)
        except psutil.Error:
            pass
    return out


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _survivors(procs: list[psutil.Process], limit_s: float = 5.0) -> list[psutil.Process]:
    """The processes of ``procs`` still alive ``limit_s`` seconds from now (sooner when every
    one of them has ended before that)."""
    t0 = time.monotonic()
    while any(_alive(p) for p in procs) and time.monotonic() - t0 < limit_s:
        time.sleep(0.05)
    return [p for p in procs if _alive(p)]


def _kill_all(procs: list[psutil.Process]) -> None:
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.kill()


def _torn_lines(metrics: Path) -> int:
    """Lines that are not one JSON record of the next step (1, 2, ...) in ``metrics``."""
    bad, want = 0, 1
    for line in metrics.read_text().splitlines() if metrics.exists() else []:
        try:
            step = json.loads(line)["step"]
        except (ValueError, KeyError, TypeError):
            bad += 1
            continue
        if step != want:
            bad += 1
        want = step + 1
    return bad


def concurrent_trial(root: Path, corpus: Path, k: int) -> dict[str, Any]:
    """Two runs of different seeds into one ``--out``: started together (even ``k``), or the
    second as ``--resume`` once the first (a long run) has saved, the first then stopped with
    SIGINT (odd ``k``)."""
    out = root / "concurrent"
    shutil.rmtree(out, ignore_errors=True)
    steps, every = ("8", "2") if k % 2 == 0 else ("100000", "5")
    base = _colossal("train", *SMALL, "--steps", steps, "--checkpoint-every", every,
                     "--corpus", str(corpus), "--out", str(out))  # fmt: skip
    logs = [root / f"cc-{i}.txt" for i in range(2)]
    with open(logs[0], "w") as e0:
        a = subprocess.Popen([*base, "--seed", "1"], stdout=subprocess.DEVNULL, stderr=e0)
    second = [*base, "--seed", "2"]
    if k % 2:
        _wait_for(lambda: (out / "checkpoint" / "latest").exists(), a)
        second.append("--resume")
    with open(logs[1], "w") as e1:
        b = subprocess.Popen(second, stdout=subprocess.DEVNULL, stderr=e1)
    b.wait(timeout=900)
    if k % 2:
        a.send_signal(signal.SIGINT)  # [Note: stopping a run]
    a.wait(timeout=900)
    errs = [log.read_text(errors="replace") for log in logs]
    refused = [("in use by a running colossal job (pid" in e) for e in errs]
    seeds, broken = set(), 0
    for d in sorted((out / "checkpoint").glob("step-*")):
        try:
            verify_manifest(d)
            seeds.add(json.loads((d / "trainer.json").read_text())["train_config"]["seed"])
        except (ColossalError, OSError, ValueError, KeyError):
            broken += 1
    stopped = [ln for ln in errs[0].splitlines() if "stopped by SIGINT" in ln]
    return {
        "torn": _torn_lines(out / "metrics.jsonl"),
        "mixed": int(len(seeds) > 1) + broken,
        "refused_with_pid": any(refused),
        "exit": (a.returncode, b.returncode),
        "sigint_one_line": (len(stopped) == 1) if k % 2 else None,
        "tracebacks": sum("Traceback" in e for e in errs),
    }


def launcher_kill_trial(root: Path, corpus: Path) -> dict[str, Any]:
    """SIGKILL ``colossal run`` (2 ranks) mid-run; count ranks alive 5 s later (or once none
    is), and whether ``--out`` can be locked again within those 5 s."""
    out = root / "launcher-kill"
    shutil.rmtree(out, ignore_errors=True)
    argv = _colossal("run", "--nproc-per-node", "2", "--master-port", _free_port(), "train",
                     *SMALL, "--steps", "5000", "--checkpoint-every", "5", "--plugin", "ddp",
                     "--corpus", str(corpus), "--out", str(out))  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_for(lambda: _lines(out / "metrics.jsonl") >= 2, proc)
    ranks = _ranks(proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    t0 = time.monotonic()
    surviving = _survivors(ranks)
    _kill_all(surviving)
    # a rank reads as ended when its main thread has; its lock goes with its last thread
    free = _lock_free(out)
    while not free and time.monotonic() - t0 < 5.0:
        time.sleep(0.05)
        free = _lock_free(out)
    return {"ranks": len(ranks), "surviving": len(surviving), "lock_free": free}


def _lock_free(out: Path) -> bool:
    """Whether ``out``'s run lock can be taken (it is released again at once)."""
    lock = RunLock(out)
    try:
        lock.acquire()
        return True
    except ColossalError:
        return False
    finally:
        lock.release()


def frozen_trial(
    root: Path, corpus: Path, plugin: str, heartbeat_timeout: float | None = None
) -> dict[str, Any]:
    """SIGSTOP rank 1 of a 2-rank ``colossal run`` after 3 steps; seconds until the job ends,
    and whether its output names rank 1. ``heartbeat_timeout``: the run's
    ``COLOSSAL_HEARTBEAT_TIMEOUT`` (None: the default)."""
    out = root / f"frozen-{plugin}"
    shutil.rmtree(out, ignore_errors=True)
    log = root / "frozen.txt"
    argv = _colossal("run", "--nproc-per-node", "2", "--master-port", _free_port(), "train",
                     *SMALL, "--steps", "5000", "--checkpoint-every", "50", "--plugin", plugin,
                     "--corpus", str(corpus), "--out", str(out))  # fmt: skip
    env = dict(os.environ)
    if heartbeat_timeout is not None:
        env["COLOSSAL_HEARTBEAT_TIMEOUT"] = str(heartbeat_timeout)
    with open(log, "w") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, env=env)
    _wait_for(lambda: _lines(out / "metrics.jsonl") >= 3, proc)
    ranks = _ranks(proc)
    victim = next(p for p in ranks if p.environ().get("RANK") == "1")
    victim.send_signal(signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        proc.wait(timeout=300)
        took = time.monotonic() - stopped
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        took = float("inf")
    _kill_all([p for p in ranks if _alive(p)])
    text = log.read_text(errors="replace")
    lines = [ln for ln in text.splitlines() if ln.startswith("error:")]
    return {
        "stop_s": took,
        "names_rank_1": any("rank 1 stopped responding" in ln for ln in lines),
        "said": next((ln for ln in lines if "stopped responding" in ln), ""),
        "last": lines[-1] if lines else "",
        "tracebacks": "Traceback" in text,
    }


def sigint_trial(root: Path, corpus: Path) -> dict[str, Any]:
    """SIGINT to ``colossal run`` (2 ranks) after a save; its exit status, its last line, the
    ranks alive 5 s later (or once none is) and whether a complete checkpoint is kept."""
    out = root / "sigint"
    shutil.rmtree(out, ignore_errors=True)
    argv = _colossal("run", "--nproc-per-node", "2", "--master-port", _free_port(), "train",
                     *SMALL, "--steps", "5000", "--checkpoint-every", "3", "--plugin", "ddp",
                     "--corpus", str(corpus), "--out", str(out))  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _wait_for(lambda: (out / "checkpoint" / "latest").exists(), proc)
    ranks = _ranks(proc)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    surviving = _survivors(ranks)
    _kill_all(surviving)
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    kept = 0
    for d in (out / "checkpoint").glob("step-*"):
        try:
            verify_manifest(d)
            kept += 1
        except ColossalError:
            pass
    return {
        "rc": proc.returncode,
        "last": errors[-1] if errors else "",
        "surviving": len(surviving),
        "kept": kept,
        "tracebacks": "Traceback" in err,
    }


CLEAN_CONFIGS = [  # (label, ranks, flags)
    ("ddp", 2, ["--plugin", "ddp"]),
    ("gemini", 2, ["--plugin", "gemini"]),
    ("zero 2", 2, ["--zero", "2"]),
    ("tp 2 + zero 1", 4, ["--tp", "2", "--zero", "1"]),
    ("gemini + tp 2", 4, ["--plugin", "gemini", "--tp", "2"]),
]


def clean_trial(root: Path, corpus: Path, ranks: int, flags: list[str]) -> dict[str, Any]:
    """A short clean run; its exit status and whether any process aborted at exit."""
    out = root / "clean"
    shutil.rmtree(out, ignore_errors=True)
    argv = _colossal("run", "--nproc-per-node", str(ranks), "--master-port", _free_port(),
                     "train", *SMALL, "--steps", "3", *flags,
                     "--corpus", str(corpus), "--out", str(out))  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900, env=env)
    text = done.stdout + done.stderr
    return {
        "rc": done.returncode,
        "aborts": text.count("terminate called") + text.count("SIGABRT"),
        "tracebacks": "Traceback" in text,
        "tail": text.strip().splitlines()[-1:] if done.returncode else [],
    }


def whole_run_rows(report: Any, root: Path, corpus: Path, quick: bool) -> None:
    """Add the rows and summary of the whole-run trials to ``report``."""
    n_cc, n_kill, n_frozen, per_cfg = (2, 1, 1, 1) if quick else (10, 10, 5, 10)
    cc = [concurrent_trial(root, corpus, k) for k in range(n_cc)]
    report.rows.append({
        "case": "two runs into one --out", "trials": n_cc,
        "detail": f"torn metrics lines: {sum(r['torn'] for r in cc)}; mixed checkpoints: "
                  f"{sum(r['mixed'] for r in cc)}; refused naming the pid: "
                  f"{sum(r['refused_with_pid'] for r in cc)}/{n_cc}; exits: "
                  f"{[r['exit'] for r in cc]}; first run stopped by SIGINT in one line: "
                  f"{sum(bool(r['sigint_one_line']) for r in cc)}/{n_cc // 2}; tracebacks: "
                  f"{sum(r['tracebacks'] for r in cc)}",
    })  # fmt: skip
    report.summary["torn metrics lines / mixed checkpoints (concurrent runs)"] = (
        f"{sum(r['torn'] for r in cc)} / {sum(r['mixed'] for r in cc)}"
    )
    kills = [launcher_kill_trial(root, corpus) for _ in range(n_kill)]
    report.rows.append({
        "case": "colossal run killed (SIGKILL)", "trials": n_kill,
        "detail": f"ranks alive 5 s later: {sum(r['surviving'] for r in kills)} of "
                  f"{sum(r['ranks'] for r in kills)}; --out free again: "
                  f"{sum(r['lock_free'] for r in kills)}/{n_kill}",
    })  # fmt: skip
    report.summary["ranks surviving a killed launcher after 5 s"] = sum(
        r["surviving"] for r in kills
    )
    frozen = [frozen_trial(root, corpus, "ddp" if i % 2 else "gemini") for i in range(n_frozen)]
    times = [r["stop_s"] for r in frozen]
    report.rows.append({
        "case": "rank 1 frozen (SIGSTOP)", "trials": n_frozen,
        "detail": f"job stopped after s: {[round(t, 1) for t in times]}; names rank 1: "
                  f"{sum(r['names_rank_1'] for r in frozen)}/{n_frozen}; tracebacks: "
                  f"{sum(r['tracebacks'] for r in frozen)}; last line: {frozen[-1]['last']}",
    })  # fmt: skip
    report.summary["frozen rank: max s to stop / named"] = (
        f"{max(times):.1f} / {sum(r['names_rank_1'] for r in frozen)} of {n_frozen}"
    )
    aborts, failed, total = 0, [], 0
    for label, ranks, flags in CLEAN_CONFIGS:
        results = [clean_trial(root, corpus, ranks, flags) for _ in range(per_cfg)]
        total += per_cfg
        aborts += sum(r["aborts"] for r in results)
        failed += [f"{label}: {r['rc']} {r['tail']}" for r in results if r["rc"]]
        report.rows.append({
            "case": f"clean run, {ranks} ranks, {label}", "trials": per_cfg,
            "detail": f"aborts at exit: {sum(r['aborts'] for r in results)}; non-zero exits: "
                      f"{sum(bool(r['rc']) for r in results)}; tracebacks: "
                      f"{sum(r['tracebacks'] for r in results)}",
        })  # fmt: skip
    report.summary["aborts at exit in clean runs"] = f"{aborts} in {total} runs"
    if failed:
        report.summary["clean runs that failed"] = "; ".join(failed)[:500]
