"""Faults: kill -9 at random moments while `colossal train` saves and re-saves checkpoints, and
kill a rank of a two-rank run; count checkpoints lost, resumes that fail, and how long the
surviving rank takes to stop (and whether it names the dead one).

A save trial trains GPT-nano with a checkpoint every step (so most of the wall time after the
first step is spent saving) and kills the process at a uniformly random point of its save phase,
timed by the run itself ([Note: kill timing]). A re-save trial first finishes a run, points
`latest` back to step 1 and resumes, so every save replaces a complete step directory (the path
that used to delete before renaming), and is killed the same way. Just before each kill the
complete step directories and the step `latest` names are recorded; afterwards none of them may
be missing or incomplete, the checkpoint found must be at least as new, and `colossal train
--resume` must succeed. After the kill, a hidden `.step-N-*` directory (or `.latest.tmp`) left in
the checkpoint folder says the kill landed inside a save: the process is dead, so the folder
shows exactly what it was doing.

[Note: kill timing] A fixed window after the first publish outlives a fast run (on a quiet
machine 14 of 40 kills hit the exit of a 30-step run, not a save). Instead each trial draws a
save uniformly among the run's saves but its first (``target``, up to the final step's) and a
uniform fraction ``frac``, polls the checkpoint folder every 2 ms, and kills ``frac`` of one
save's duration after that save's temporary directory appears; a save's duration is the median
measured in this same run (temporary directory seen while ``latest`` names an older step, to
``latest`` naming it; a directory first seen mid-swap is not timed), so the timing follows the
machine's pace. A save shorter than it was before ends before the kill: such a kill
lands between saves (or, after the final one, in the run's exit) and is counted so.
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

import _faults_runs as runs
from rich.console import Console

from colossal import TrainConfig, train
from colossal.booster import find_checkpoint
from colossal.checkpoint._publish import LATEST, is_complete
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


def _published(ckpt: Path) -> int:
    """The step ``latest`` names (0 before any): one small read, cheap enough to poll."""
    try:
        return _step_of((ckpt / LATEST).read_text().strip()) or 0
    except OSError:
        return 0


def _saving(ckpt: Path) -> bool:
    """A save's temporary directory (or the pointer's temporary file) is in ``ckpt``."""
    if not ckpt.is_dir():
        return False
    return any(p.name.startswith(".step-") or p.name == f".{LATEST}.tmp" for p in ckpt.iterdir())


def _hidden_steps(ckpt: Path) -> set[int]:
    """Steps whose save's temporary ``.step-N-*`` directory is in ``ckpt``."""
    if not ckpt.is_dir():
        return set()
    steps = (_step_of(p.name) for p in ckpt.iterdir() if p.name.startswith(".step-"))
    return {s for s in steps if s is not None}


def _wait_for_kill_point(proc: subprocess.Popen, ckpt: Path, target: int, frac: float) -> float:
    """Return at fraction ``frac`` of the save of step ``target`` (see [Note: kill timing]), or
    when the run ends (or after 600 s); returns the estimate of one save's seconds used."""
    started: dict[int, float] = {}  # step -> when its temporary directory was first seen
    took: list[float] = []  # seconds from that to ``latest`` naming the step
    t0 = time.monotonic()
    while proc.poll() is None and time.monotonic() - t0 < 600:
        now, step = time.monotonic(), _published(ckpt)
        for j in _hidden_steps(ckpt):
            if j > step:  # seen while written; one first seen mid-swap would measure 0 s
                started.setdefault(j, now)
        for j in [j for j in started if j <= step]:
            took.append(now - started.pop(j))
        if target in started or step >= target:  # a save too quick to see: kill now
            estimate = statistics.median(took) if took else 0.0
            time.sleep(frac * estimate if target in started else 0.0)
            return estimate
        time.sleep(0.002)
    return 0.0


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
    return TrainConfig.from_flags(**{**base, **kw})  # type: ignore[arg-type]


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
    first, last = (2 if resave else 1), int(STEPS)
    target, frac = rng.randint(first + 1, last), rng.random()
    save_s = _wait_for_kill_point(proc, ckpt, target, frac)
    complete_before = _complete_steps(ckpt)
    latest_before = _latest_step(ckpt)
    finished_first = proc.poll() is not None
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    in_save = _saving(ckpt)  # the dead process left its save's temporary directory
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
        # one step past the checkpoint it finds (and its save) shows the resume works
        train(_config(corpus, out, steps=latest_after + 1, resume=True), console=_QUIET)
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
        "kill_point": (target, frac),
        "save_s": save_s,
        "in_save": in_save,
        "after_last_save": finished_first or latest_before >= last,
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
            "kills_in_a_save",
            "kills_between_saves",
            "kills_after_last_save",
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
                    "kills_in_a_save": sum(r["in_save"] for r in results),
                    "kills_between_saves": sum(
                        not r["in_save"] and not r["after_last_save"] for r in results
                    ),
                    "kills_after_last_save": sum(r["after_last_save"] for r in results),
                    "detail": (
                        f"latest step at kill: {sorted(r['latest_before'] for r in results)}; "
                        "one save as measured in the runs, median s: "
                        f"{statistics.median(r['save_s'] for r in results):.3f}; "
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
        runs.whole_run_rows(report, root, corpus, quick)
    saves = [r for r in report.rows if "saves" in r["case"]]
    report.summary["completed checkpoints lost"] = sum(
        r["completed_checkpoints_lost"] for r in saves
    )
    report.summary["resumes that worked"] = (
        f"{sum(r['resume_ok'] for r in saves)}/{sum(r['trials'] for r in saves)}"
    )
    report.summary["kills inside a save / between saves / after the last save"] = (
        f"{sum(r['kills_in_a_save'] for r in saves)} / "
        f"{sum(r['kills_between_saves'] for r in saves)} / "
        f"{sum(r['kills_after_last_save'] for r in saves)}"
    )
    report.notes += [
        "Save trials: GPT-nano (Gemini, fp32, 30 steps) with --checkpoint-every 1; SIGKILL at a "
        "uniform random point of one of the run's saves (its first excepted), timed by the "
        "median save duration measured in the same run (temporary directory seen to `latest` "
        "naming the step; polled every 2 ms; re-save "
        "trials: a finished run's latest moved back to step 1, resumed, so each save replaces a "
        "complete step; its first re-save excepted). 'In a save' counts kills that "
        "left a save's hidden .step-N-* directory (or .latest.tmp) behind: the dead process "
        "was between creating it and publishing it; 'between saves' the others of a run that "
        "had not published its last step; 'after the last save' kills of a run already "
        "exiting. 'Lost' counts steps held "
        "by a complete directory (step-N, or the hidden new copy `latest` names mid-swap) just "
        "before "
        "the kill and not complete after, plus a `latest` that resolves to an older step; "
        "'not_step_dirs_after_resume' counts those steps that are not a complete step-N after "
        "the resumed run's save (which finishes publishes that a kill cut short).",
        "Rank death: two ranks on gloo over loopback, rank 1 SIGKILLed after 3 steps; under "
        "env:// rank 0 detects it through the heartbeat counters; under `colossal run` torchrun's "
        "agent stops rank 0 (SIGTERM) and names the failed rank. Exit time is from the kill to the "
        "survivor's (or the launcher's) exit.",
        "Concurrent runs: two `colossal train` runs (seeds 1 and 2) into one --out, started "
        "together, or the second as --resume once the first (a long run) saved, the first then "
        "stopped with SIGINT; 'torn' counts metrics lines "
        "that are not one record of the next step, 'mixed' checkpoint folders of the other seed "
        "or failing their manifest. Launcher kills: SIGKILL to `colossal run` (2 ranks, ddp) "
        "after 2 steps; ranks alive 5 s later. Frozen rank: SIGSTOP to rank 1 of a 2-rank "
        "`colossal run` after 3 steps; seconds until the job ended. Clean runs: 3 steps each "
        "through `colossal run`, counting 'terminate called' / SIGABRT in their output and "
        "non-zero exits.",
        "Measured on a 2-core machine shared with other jobs: times are noisy upper bounds.",
    ]
    return report
