"""Faults: kill -9 at random moments while `colossal train` saves and re-saves checkpoints, and
kill a rank of a two-rank run; count checkpoints lost, resumes that fail, and how long the
surviving rank takes to stop (and whether it names the dead one).

A save trial trains GPT-nano with a checkpoint every step (so most of the wall time after the
first step is spent saving) and kills the process at a uniformly random moment in the 3 s after
its first checkpoint is published. A re-save trial first finishes a run, points `latest` back to step 1 and
resumes, so every save replaces a complete step directory (the path that used to delete before
renaming), and is killed the same way. Just before each kill the complete step directories and
the step `latest` names are recorded; afterwards none of them may be missing or incomplete, the
checkpoint found must be at least as new, and `colossal train --resume` must succeed.
"""

from __future__ import annotations

import io
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console

from colossal import TrainConfig, train
from colossal.booster import find_checkpoint
from colossal.booster._publish import is_complete
from colossal_models import default_corpus_path

from _report import Report

TRAIN = ["--preset", "nano", "--batch-size", "2", "--seq-len", "32", "--lr", "1e-3"]
_QUIET = Console(file=io.StringIO())
STEPS = "30"


def _colossal(*args: str) -> list[str]:
    return [sys.executable, "-m", "colossal", *args]


def _corpus(root: Path) -> Path:
    path = root / "corpus.txt"
    path.write_bytes((default_corpus_path() / "argparse.py").read_bytes())
    return path


def _step_of(name: str) -> int | None:
    """N of ``step-N`` or of a hidden ``.step-N-*`` (a publish in flight)."""
    parts = name.lstrip(".").split("-")
    return int(parts[1]) if parts[0] == "step" and len(parts) >= 2 and parts[1].isdigit() else None


def _complete_steps(ckpt: Path, *, published_only: bool = False) -> set[int]:
    """Steps held by a complete directory: ``step-N``, or (unless ``published_only``) a complete
    hidden copy, which ``latest`` names while a re-save swaps it in and the next save publishes."""
    if not ckpt.is_dir():
        return set()
    out = set()
    for p in ckpt.iterdir():
        step = _step_of(p.name)
        hidden = p.name.startswith(".")
        if step is not None and not (hidden and published_only) and is_complete(p):
            out.add(step)
    return out


def _latest_step(ckpt: Path) -> int:
    found = find_checkpoint(ckpt)
    return (_step_of(found.name) or 0) if found else 0


def _finished_run(root: Path, corpus: Path) -> Path:
    """A finished run with a checkpoint at every step, to be copied for each re-save trial."""
    out = root / "finished"
    if not out.exists():
        train(_config(corpus, out, steps=int(STEPS), checkpoint_every=1), console=_QUIET)
    return out


def _config(corpus: Path, out: Path, **kw: object) -> TrainConfig:
    base = dict(preset="nano", batch_size=2, seq_len=32, lr=1e-3, corpus=corpus, out=out)
    return TrainConfig(**{**base, **kw})  # type: ignore[arg-type]


def save_kill_trial(root: Path, corpus: Path, rng: random.Random, *, resave: bool) -> dict:
    """One kill during saves (or re-saves); the facts the report counts."""
    out = root / "run"
    shutil.rmtree(out, ignore_errors=True)
    ckpt = out / "checkpoint"
    argv = _colossal("train", *TRAIN, "--steps", STEPS, "--checkpoint-every", "1",
                     "--corpus", str(corpus), "--out", str(out))  # fmt: skip
    if resave:  # latest moved back to step 1: every save replaces a complete step directory
        shutil.copytree(_finished_run(root, corpus), out)
        (ckpt / "latest").write_text("step-1\n")
        argv.append("--resume")
    log = root / "trial-stderr.txt"
    with open(log, "w") as err_file:  # the child keeps its own descriptor
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err_file)
    t0 = time.monotonic()
    while proc.poll() is None and time.monotonic() - t0 < 600:
        if (ckpt / "latest").exists() and _latest_step(ckpt) >= (2 if resave else 1):
            break  # the first (re-)save is published: kills from here on hit saves
        time.sleep(0.01)
    time.sleep(rng.uniform(0.0, 3.0))
    complete_before = _complete_steps(ckpt)
    latest_before = _latest_step(ckpt)
    finished_first = proc.poll() is not None
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    early = []  # a run that ended on its own before any save: its exit status and last line
    if finished_first and latest_before == 0:
        lines = log.read_text(errors="replace").strip().splitlines()
        early = [f"exit {proc.returncode}: {lines[-1] if lines else '(no output)'}"]
    complete_after = _complete_steps(ckpt)
    lost = sorted(complete_before - complete_after)
    latest_after = _latest_step(ckpt)
    if lost or latest_after < latest_before:  # keep the evidence for the report
        seen = sorted(p.name for p in ckpt.iterdir())
        print(f"faults: lost {lost}, latest {latest_before} -> {latest_after}: {seen}")
    error = []
    try:  # in this process: one interpreter start per trial is enough
        train(_config(corpus, out, steps=int(STEPS) + 1, resume=True), console=_QUIET)
    except Exception as err:
        error = [f"{type(err).__name__}: {err}"]
    # the resume's save cleaned up: every step complete before the kill is a published step-N
    unpublished = sorted(complete_before - _complete_steps(ckpt, published_only=True))
    return {
        "lost": len(lost) + (latest_after < latest_before),
        "unpublished_after_resume": len(unpublished),
        "resume_ok": not error,
        "resume_error": error,
        "latest_before": latest_before,
        "finished_before_kill": finished_first,
        "ended_before_first_save": early,
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_death_trial(root: Path, corpus: Path, *, launcher: str, plugin: str) -> dict:
    """Kill rank 1 of a two-rank run after a few steps; time until rank 0 (or the launcher)
    exits, and whether its last line names rank 1."""
    import psutil

    out = root / f"rd-{launcher}-{plugin}"
    shutil.rmtree(out, ignore_errors=True)
    args = ["train", "--preset", "nano", "--steps", "5000", "--batch-size", "2", "--seq-len",
            "16", "--corpus", str(corpus), "--out", str(out), "--plugin", plugin]  # fmt: skip
    port = str(_free_port())
    if launcher == "colossal run":
        main = subprocess.Popen(
            _colossal("run", "--nproc-per-node", "2", "--master-port", port, *args),
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        procs = [main]
    else:
        procs = []
        for rank in range(2):
            env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
                       LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=port)  # fmt: skip
            quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.PIPE, "text": True}
            procs.append(subprocess.Popen(_colossal(*args), env=env, **quiet))
        main = procs[0]
    metrics = out / "metrics.jsonl"
    t0 = time.monotonic()
    while time.monotonic() - t0 < 300 and main.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 3:
            break
        time.sleep(0.05)
    if launcher == "colossal run":
        victim = next(
            c.pid
            for c in psutil.Process(main.pid).children(recursive=True)
            if c.environ().get("RANK") == "1"
        )
    else:
        victim = procs[1].pid
    os.kill(victim, signal.SIGKILL)
    killed = time.monotonic()
    try:
        _, err = main.communicate(timeout=600)
        exit_s = time.monotonic() - killed
    except subprocess.TimeoutExpired:
        main.kill()
        _, err = main.communicate()
        exit_s = float("inf")
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()
    last = [ln for ln in err.strip().splitlines() if ln.startswith("error:")][-1:]
    return {
        "exit_s": exit_s,
        "names_rank_1": bool(last) and "rank 1" in last[0],
        "traceback": "Traceback" in err,
        "last": last[0] if last else "",
    }


def run(quick: bool, out_dir: Path) -> Report:
    trials = 3 if quick else 20
    rd_trials = 1 if quick else 3
    rng = random.Random(0)
    report = Report(
        name="faults",
        title="Faults: kill -9 during saves and re-saves; a rank killed mid-run",
        columns=[
            "case",
            "trials",
            "completed_checkpoints_lost",
            "resume_ok",
            "not_step_dirs_after_resume",
            "detail",
        ],
    )
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        corpus = _corpus(root)
        for resave in (False, True):
            results = [save_kill_trial(root, corpus, rng, resave=resave) for _ in range(trials)]
            errors = sorted({e for r in results for e in r["resume_error"]})
            early = sorted({e for r in results for e in r["ended_before_first_save"]})
            report.rows.append(
                {
                    "case": "kill -9 during re-saves" if resave else "kill -9 during saves",
                    "trials": trials,
                    "completed_checkpoints_lost": sum(r["lost"] for r in results),
                    "resume_ok": sum(r["resume_ok"] for r in results),
                    "not_step_dirs_after_resume": sum(
                        r["unpublished_after_resume"] for r in results
                    ),
                    "detail": (
                        f"latest step at kill: {sorted(r['latest_before'] for r in results)}; "
                        f"finished before the kill: {sum(r['finished_before_kill'] for r in results)}"
                        + (f"; resume errors: {errors}" if errors else "")
                        + (f"; runs that ended before their first save: {early}" if early else "")
                    ),
                }
            )
        for launcher in ("env://", "colossal run"):
            for plugin in ("ddp", "gemini"):
                results = [
                    rank_death_trial(root, corpus, launcher=launcher, plugin=plugin)
                    for _ in range(rd_trials)
                ]
                times = [r["exit_s"] for r in results]
                report.rows.append(
                    {
                        "case": f"rank 1 killed ({launcher}, {plugin})",
                        "trials": rd_trials,
                        "completed_checkpoints_lost": "",
                        "resume_ok": "",
                        "detail": (
                            f"survivor exit s: median {statistics.median(times):.1f}, max "
                            f"{max(times):.1f}; names rank 1: "
                            f"{sum(r['names_rank_1'] for r in results)}/{rd_trials}; tracebacks: "
                            f"{sum(r['traceback'] for r in results)}; last line: {results[-1]['last']}"
                        ),
                    }
                )
                report.summary[f"survivor exit s ({launcher}, {plugin}), max"] = max(times)
    saves = [r for r in report.rows if "saves" in r["case"]]
    report.summary["completed checkpoints lost"] = sum(
        r["completed_checkpoints_lost"] for r in saves
    )
    report.summary["resumes that worked"] = (
        f"{sum(r['resume_ok'] for r in saves)}/{sum(r['trials'] for r in saves)}"
    )
    report.notes += [
        "Save trials: GPT-nano (Gemini, fp32, 30 steps) with --checkpoint-every 1; SIGKILL at a "
        "uniform random moment in the 3 s after the first checkpoint is published (re-save "
        "trials: a finished run's latest moved back to step 1, resumed, so each save replaces a "
        "complete step; killed in the 3 s after the first re-save). 'Lost' counts steps held "
        "by a complete directory (step-N, or the hidden new copy `latest` names mid-swap) just "
        "before "
        "the kill and not complete after, plus a `latest` that resolves to an older step; "
        "'not_step_dirs_after_resume' counts those steps that are not a complete step-N after "
        "the resumed run's save (which finishes publishes that a kill cut short).",
        "Rank death: two ranks on gloo over loopback, rank 1 SIGKILLed after 3 steps; under "
        "env:// rank 0 detects it through the heartbeat counters; under `colossal run` torchrun's "
        "agent stops rank 0 (SIGTERM) and names the failed rank. Exit time is from the kill to the "
        "survivor's (or the launcher's) exit.",
        "Measured on a 2-core machine shared with other jobs: times are noisy upper bounds.",
    ]
    return report
