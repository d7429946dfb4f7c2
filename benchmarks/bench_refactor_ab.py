"""Refactor A/B: Gemini's step time in the code before issue 30's refactor against the current tree,
side by side in one run (the two sides alternate step by step, in ABBA order, on the same batches).

The "before" tree is commit 3b57d26 (the parent of the refactor's first commit; ``BENCH_AB_BEFORE``
names another), extracted with ``git archive`` into a temporary folder and removed afterwards.
Each side runs in its own long-lived worker processes (``_ab_worker.py``, one per rank) with
``PYTHONPATH`` set to that tree's ``packages/*/src``; a worker builds its model once per case and
steps on command over a pipe, so the alternation is per step. Cases: the overhead benchmark's
Gemini on one rank and the scaling benchmark's Gemini on two, each with no budget and with a
quarter of the compute-tier bytes a no-budget step held (chunks move every step).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from _report import Report, load_note

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BEFORE = "3b57d26"  # parent of the first issue-30 commit
AIM = 1.02  # current / before, median of the paired ratios, per case
WARM = 3  # Gemini: traced warmup, re-pack in first-use order, state-placement measurement


def _tree(commit: str, into: Path) -> Path:
    """The repository's ``packages/`` at ``commit``, extracted under ``into``."""
    into.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit, "packages"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Side:
    """One tree's worker processes (one per rank), driven together: every command goes to every
    rank, and rank 0's answer comes back."""

    def __init__(self, label: str, tree: Path, world: int, logs: Path):
        self.label, self.tree = label, tree.resolve()
        srcs = sorted(str(p) for p in (tree / "packages").glob("*/src"))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(srcs), AB_WORLD=str(world))
        env["AB_GATHER_AHEAD"] = os.environ.get("BENCH_AB_GATHER_AHEAD", "1")
        env["AB_PORT"] = str(_free_port())
        self.logs = [logs / f"{label}-{world}-{r}.log" for r in range(world)]
        self.procs = [
            subprocess.Popen(
                [sys.executable, str(HERE / "_ab_worker.py")],
                env=dict(env, AB_RANK=str(r)),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self.logs[r].open("w"),
                text=True,
                bufsize=1,
            )
            for r in range(world)
        ]
        for f in self._answers()[0]["files"]:  # the imports came from this side's tree
            if not Path(f).resolve().is_relative_to(self.tree):
                raise RuntimeError(f"{label} imported {f}, outside {self.tree}")

    def _answers(self) -> list[dict[str, Any]]:
        out = []
        for p, log in zip(self.procs, self.logs, strict=True):
            line = p.stdout.readline() if p.stdout else ""
            if not line:
                tail = log.read_text()[-3000:]
                raise RuntimeError(f"{self.label} worker stopped; its stderr ends:\n{tail}")
            out.append(json.loads(line))
        return out

    def call(self, **cmd: Any) -> dict[str, Any]:
        for p in self.procs:
            assert p.stdin is not None
            p.stdin.write(json.dumps(cmd) + "\n")
            p.stdin.flush()
        return self._answers()[0]

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None and p.stdin is not None:
                p.stdin.write(json.dumps({"op": "quit"}) + "\n")
                p.stdin.close()
        for p in self.procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()


def _case(sides: dict[str, _Side], preset: str, budget: int | None, pairs: int,
          batch: int, seq: int) -> dict[str, Any]:  # fmt: skip
    """Build the case on both sides, warm both, then ``pairs`` pairs of steps (the same batch for
    both; the side that steps first alternates: before, current | current, before | ...)."""
    chunks = {k: s.call(op="build", preset=preset, budget=budget)["num_chunks"]
              for k, s in sides.items()}  # fmt: skip
    times: dict[str, list[float]] = {k: [] for k in sides}
    losses: dict[str, list[float]] = {k: [] for k in sides}
    names = list(sides)
    for i in range(WARM + pairs):
        order = names if i % 2 == 0 else names[::-1]
        for k in order:
            r = sides[k].call(op="step", i=i, batch=batch, seq=seq)
            losses[k].append(r["loss"])
            if i >= WARM:
                times[k].append(r["s"])
    stats = {k: s.call(op="stats") for k, s in sides.items()}
    before, current = names
    ratios = [c / b for c, b in zip(times[current], times[before], strict=True)]
    return {
        "times": times,
        "ratios": ratios,
        "same_losses": losses[before] == losses[current],
        "chunks": chunks,
        "stats": stats,
    }


def run(quick: bool, out_dir: Path) -> Report:
    commit = os.environ.get("BENCH_AB_BEFORE", BEFORE)
    presets = ["tiny"] if quick else ["tiny", "mini"]
    ranks = (1, 2)
    batch, seq = (4, 64) if quick else (8, 64)
    pairs = {"tiny": 40 if quick else 300, "mini": 40 if quick else 60}
    load_before = os.getloadavg()[0]
    rows: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}
    scratch = Path(tempfile.mkdtemp(prefix="refactor-ab-"))
    try:
        trees = {
            f"before ({commit})": _tree(commit, scratch / "before"),
            "current": ROOT,
        }
        for n in ranks:
            for preset in presets:
                sides = {k: _Side(k.split()[0], t, n, scratch) for k, t in trees.items()}
                try:
                    free = _case(sides, preset, None, pairs[preset], batch, seq)
                    quarter = free["stats"]["current"]["peak"] // 4
                    moving = _case(sides, preset, quarter, pairs[preset], batch, seq)
                finally:
                    for s in sides.values():
                        s.close()
                print(f"refactor_ab: {preset} on {n} rank(s) done", file=sys.stderr)
                for label, r in (("no budget", free), (f"1/4 budget ({quarter:,} B)", moving)):
                    b, c = (statistics.median(t) for t in r["times"].values())
                    paired = statistics.median(r["ratios"])
                    q = statistics.quantiles(r["ratios"], n=4)
                    st = list(r["stats"].values())
                    nc = list(r["chunks"].values())
                    rows.append({
                        "preset": preset, "ranks": n, "budget": label,
                        "before ms": b * 1e3, "current ms": c * 1e3,
                        "current / before (medians)": c / b,
                        "current / before (paired median)": paired,
                        "paired IQR": f"{q[0]:.3f}-{q[2]:.3f}",
                        "pairs": len(r["ratios"]),
                        "same losses": r["same_losses"],
                        "chunks before / current": f"{nc[0]} / {nc[1]}",
                        "moved MiB before / current":
                            f"{st[0]['moved'] / 2**20:.1f} / {st[1]['moved'] / 2**20:.1f}",
                    })  # fmt: skip
                    summary[f"{preset} {n} rank(s), {label.split(' (')[0]}: paired"] = paired
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    summary[f"aim: current / before <= {AIM} (paired median) in every case"] = all(
        r["current / before (paired median)"] <= AIM for r in rows
    )
    summary["same losses step by step in every case"] = all(r["same losses"] for r in rows)
    notes = [
        f"Before: commit {commit} (BENCH_AB_BEFORE overrides), the parent of issue 30's first "
        "commit, extracted with git archive; current: this checkout. Each side runs in its own "
        "worker processes (benchmarks/_ab_worker.py, one per rank) importing only its own "
        "tree's packages (checked on start); a worker builds each case once and steps on "
        "command, so the two sides alternate step by step. 'Current' holds every change since "
        "that commit, the refactor's and the other work merged meanwhile (update in backward, "
        "dead shards, the streaming re-pack): the ratio bounds them together.",
        "GPT presets " + ", ".join(presets) + f", fp32, a global batch of {batch} x {seq} tokens "
        "split over the ranks; apply_gemini(GeminiConfig(precision='fp32', accelerator_bytes="
        "budget)) + GeminiOptimizer.from_torch(AdamW lr 1e-3), the APIs both trees share. One "
        "rank: no torch.distributed (as the overhead benchmark); two ranks: a gloo world per "
        "side over loopback, each step between barriers, rank 0's clock (as the scaling "
        "benchmark).",
        "Budgets: none (every chunk stays on the compute tier), and a quarter of the compute "
        "tier's peak bytes in the current side's no-budget case (the scaling benchmark's "
        "'1/4 budget'; chunks move every step), the same number for both sides.",
        f"{WARM} warm-up steps per side dropped (traced warmup, re-pack, state-placement "
        "measurement), then pairs of steps on the same batch, the side that steps first "
        "alternating (ABBA); 'paired median' is the median over the pairs of current / before, "
        "which cancels load that drifts between steps; the aim reads it. 'same losses': both "
        "sides computed bit-identical losses at every step (behaviour unchanged).",
        "Gemini's gathers of several chunks ahead in one collective (GeminiConfig."
        "gather_ahead, after the refactor) are held at 1, the behaviour before, so that the "
        "ratio is the refactor's alone (BENCH_AB_GATHER_AHEAD sets another depth).",
        "The noise floor: BENCH_AB_BEFORE=HEAD runs the current tree against itself (an A/A "
        "run); the spread of its paired medians around 1 is what a ratio here can resolve.",
        load_note(load_before, "both sides share that load, step by step"),
    ]
    return Report(
        name="refactor_ab",
        title="Gemini step time before and after the issue-30 refactor, side by side",
        columns=["preset", "ranks", "budget", "before ms", "current ms",
                 "current / before (medians)", "current / before (paired median)", "paired IQR", "pairs",
                 "same losses", "chunks before / current", "moved MiB before / current"],
        rows=rows,
        summary=summary,
        notes=notes,
    )  # fmt: skip
