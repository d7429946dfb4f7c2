"""Peak RSS of ``colossal train``'s setup (building the model and boosting it), the model built
lazily as the job does ([Note: lazy job]) against built eagerly, under Gemini with host, emulated
accelerator and disk budgets far below the model's states, and under ZeRO-2.

Each trial runs ``colossal.train.train`` in a fresh process and stops it once ``Booster.boost``
returns. A thread samples the process's RSS every 2 ms from just before the model is built until
then. The fixed overhead is the RSS just before the measured model is built, after the same setup
ran once on GPT nano in that process (Python, torch, the libraries, the pages a first setup
touches, the data and tokenizer). Under Gemini the chunks that the accelerator budget B (emulated: host memory) and the host
budget H hold stay resident, so the aim is a setup peak within B + H + one chunk + 8 MiB over the
overhead; the eager build adds the whole fp32 model on top. ZeRO-2 keeps the whole model and its
fp32 masters: there the lazy build saves the eager model's transient copy only.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from _report import Report

MiB = 2**20
_BUDGETS = {"tiny": (8 * MiB, 16 * MiB), "small": (64 * MiB, 128 * MiB)}  # preset -> (B, H)
_COLUMNS = [
    "plugin",
    "method",
    "preset",
    "params",
    "model_fp32_MiB",
    "states_MiB",
    "B_MiB",
    "H_MiB",
    "chunk_MiB",
    "overhead_MiB",
    "setup_peak_over_overhead_MiB",
    "over_B_H_MiB",
    "over_B_H_chunks",
    "setup_s",
]


class _SetupDone(Exception):
    """Raised from ``Booster.boost`` once the setup is measured: the run stops there."""


def _child(plugin: str, method: str, preset: str) -> dict:
    """One trial in this process (see the module docstring): the setup on GPT nano first."""
    _setup(plugin, method, "nano", {})
    out: dict = {}
    _setup(plugin, method, preset, out)
    return out


def _setup(plugin: str, method: str, preset: str, out: dict) -> None:
    from colossal.booster import Booster
    from colossal.train import TrainConfig, train

    loop = importlib.import_module("colossal.train._setup")  # where the job builds
    models = importlib.import_module("colossal.train._models")
    proc = psutil.Process()
    peak, stop = [0], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss)
            time.sleep(0.002)

    build, boost = loop.build_model, Booster.boost

    def measured_build(spec, name, **kw):  # type: ignore[no-untyped-def]
        out.update(base=proc.memory_info().rss, t0=time.perf_counter(), params=spec.num_params)
        peak[0] = out["base"]
        threading.Thread(target=sample, daemon=True).start()
        kept = models.LAZY_PLUGINS
        if method == "eager":
            models.LAZY_PLUGINS = ()
        try:
            return build(spec, name, **kw)
        finally:
            models.LAZY_PLUGINS = kept

    def measured_boost(self, model, optimizer):  # type: ignore[no-untyped-def]
        model, optimizer = boost(self, model, optimizer)
        stop.set()
        out.update(peak=max(peak[0], proc.memory_info().rss), t1=time.perf_counter())
        gm = getattr(self.plugin, "_model", None)
        out["chunk"] = gm.runtime.manager.registry.chunk_numel * 4 if gm is not None else 0
        raise _SetupDone

    loop.build_model, Booster.boost = measured_build, measured_boost
    with tempfile.TemporaryDirectory(prefix="bench-job-rss-") as tmp:
        corpus = Path(tmp) / "corpus.txt"
        corpus.write_text("the quick brown fox jumps over the lazy dog. " * 400)
        budgets = {}
        if plugin == "gemini":
            b, h = _BUDGETS.get(preset, (8 * MiB, 16 * MiB))
            budgets = dict(accelerator_budget=b, host_budget=h, disk_budget="4GiB", disk_dir=tmp)
        cfg = TrainConfig.from_flags(
            preset=preset,
            steps=1,
            batch_size=1,
            seq_len=16,
            corpus=corpus,
            out=Path(tmp) / "run",
            plugin=plugin,
            **({"zero": 2} if plugin == "zero" else {}),
            **budgets,
        )
        with contextlib.suppress(_SetupDone):  # the run stops once boosted
            train(cfg)
    loop.build_model, Booster.boost = build, boost


def _trial(plugin: str, method: str, preset: str) -> dict:
    cmd = [sys.executable, __file__, plugin, method, preset]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"trial {plugin}/{method}/{preset} failed:\n{done.stderr[-3000:]}")
    r = json.loads(done.stdout.strip().splitlines()[-1])
    over = r["peak"] - r["base"]
    b, h = _BUDGETS[preset]
    resident = b + h if plugin == "gemini" else 0
    chunk = r["chunk"]
    return {
        "plugin": plugin,
        "method": method,
        "preset": preset,
        "params": r["params"],
        "model_fp32_MiB": 4 * r["params"] / MiB,
        "states_MiB": 16 * r["params"] / MiB,
        "B_MiB": b / MiB if plugin == "gemini" else "-",
        "H_MiB": h / MiB if plugin == "gemini" else "-",
        "chunk_MiB": chunk / MiB if chunk else "-",
        "overhead_MiB": r["base"] / MiB,
        "setup_peak_over_overhead_MiB": over / MiB,
        "over_B_H_MiB": (over - resident) / MiB if plugin == "gemini" else "-",
        "over_B_H_chunks": (over - resident) / chunk if chunk else "-",
        "setup_s": r["t1"] - r["t0"],
    }


def run(quick: bool, out_dir: Path) -> Report:
    trials = [("tiny", p, m) for p in ("gemini", "zero") for m in ("lazy", "eager")]
    if not quick:
        trials += [("small", "gemini", m) for m in ("lazy", "eager")]
    report = Report(
        name="job_rss",
        title="Peak RSS of colossal train's setup (build + boost), lazy (the job's) vs eager "
        "build; Gemini under budgets B (emulated accelerator) + H (host) + disk far below the "
        "states, and ZeRO-2",
        columns=_COLUMNS,
    )
    for preset, plugin, method in trials:
        report.rows.append(_trial(plugin, method, preset))
    for row in report.rows:
        if row["plugin"] == "gemini" and row["method"] == "lazy":
            aim = 8 + (row["chunk_MiB"] if row["chunk_MiB"] != "-" else 0)
            key = f"gemini {row['preset']}: lazy setup over B + H (MiB; aim <= chunk + 8)"
            report.summary[key] = round(row["over_B_H_MiB"], 1)
            report.summary[f"gemini {row['preset']}: aim met"] = row["over_B_H_MiB"] <= aim
    report.notes.append(
        "overhead: RSS just before the model is built (imports, data, tokenizer, pre-check); "
        f"load average at the end {os.getloadavg()[0]:.1f}"
    )
    return report


if __name__ == "__main__":
    print(json.dumps(_child(*sys.argv[1:4])))
