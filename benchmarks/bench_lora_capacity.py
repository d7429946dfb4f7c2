"""LoRA capacity: the largest GPT whose LoRA fine-tune (rank 8, Hugging Face ``peft``) trains 3
steps under Gemini with an emulated accelerator budget B and a host budget H, with and without
a disk tier D, against full fine-tuning under the same budgets; and the step time of the
largest LoRA fit against plain ``peft`` on one process, the two alternated step by step.

Every trial runs in a subprocess of its own (``_lora_capacity_runs.py``), so
one trial's chunks, pools and threads never crowd the next and its peak RSS is its own. A run
fits only if the tiers' accounting never passes B, H, D (a move past them is a
``CapacityError``) and the losses are finite. Models grow by width and depth along one ladder
sorted by parameters (each width with depths from w/64 to w/16, steps of at least 5%), and the
largest fit is found by bisection over the rungs within [limit/4, limit], where the limit is
(B + H [+ D]) over the chunk bytes a parameter costs (2 for a frozen bf16 one, 14 for a
trainable one: value, fp32 master, two Adam moments): nothing above it can fit.

The step-time part alone is ``python benchmarks/run.py lora_step_time`` (it reads the fit from
this benchmark's results); ``BENCH_LORA_STEP_TIME=0`` leaves it out of this run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _lora_capacity_runs import PRECISION, RANK
from bench_lora_step_time import budgets, summarise_timing, timing_note

MiB = 2**20
WIDTHS = (128, 192, 256, 384, 512, 768, 1024)
_TRIAL_TIMEOUT_S = 900


def _run_child(mode: str, spec: dict[str, Any]) -> dict[str, Any]:
    """One trial in a fresh interpreter; its JSON result (a crash or timeout: does not fit,
    with the reason)."""
    runs = Path(__file__).resolve().parent / "_lora_capacity_runs.py"
    cmd = [sys.executable, str(runs), mode, json.dumps(spec)]
    try:
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=_TRIAL_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        return {"fits": False, "why": f"timed out after {_TRIAL_TIMEOUT_S} s"}
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    tail = " ".join((done.stderr or done.stdout).strip().splitlines()[-1:])[:200]
    return {"fits": False, "why": f"trial exited {done.returncode}: {tail}"}


def ladder(lo: float, hi: float) -> list[tuple[int, int, int]]:
    """(params, depth, width) rungs with params in [lo, hi], ascending, each at least 5% above
    the one before; each width with depths from w/64 to w/16 (at least 2)."""
    from bench_capacity import _cfg

    cands = sorted(
        {
            (_cfg(d, w).num_params(), d, w)
            for w in WIDTHS
            for d in range(max(2, w // 64), max(2, w // 16) + 1)
        }
    )
    out: list[tuple[int, int, int]] = []
    for n, d, w in cands:
        if lo <= n <= hi and (not out or n >= 1.05 * out[-1][0]):
            out.append((n, d, w))
    return out


def _search(rungs, fits, guess: int):  # type: ignore[no-untyped-def]
    """The largest rung that fits (fitting taken as monotone in parameters): the predicted
    rung ``guess`` first, then rungs at 1, 2, 4 ... above it (while they fit) or below it
    (while they do not) until one fits and one does not, then bisection between them; None
    when no rung fits. About 2-3 trials where the prediction is close."""
    res: dict[int, dict[str, Any]] = {}

    def ok(i: int) -> bool:
        if i not in res:
            res[i] = fits(rungs[i])
        return bool(res[i].get("fits"))

    if ok(guess):
        lo, step = guess, 1
        while lo + step < len(rungs) and ok(lo + step):
            lo, step = lo + step, 2 * step
        hi = min(len(rungs), lo + step)
    else:
        hi, step = guess, 1
        while hi - step >= 0 and not ok(hi - step):
            hi, step = hi - step, 2 * step
        lo = max(-1, hi - step)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return (rungs[lo], res[lo]) if lo >= 0 else None


def _predicted_bytes(method: str, depth: int, width: int) -> float:
    """Chunk bytes a rung needs by the formula (2 B a frozen bf16 parameter, 14 B a trainable
    one), plus padding (4% full, 2% for frozen chunks sized apart): where the search starts."""
    from bench_capacity import _cfg

    n = _cfg(depth, width).num_params()
    if method == "full":
        return 1.04 * 14 * n
    adapters = RANK * 16 * width * depth  # qkv h->3h, proj h->h, fc h->4h, proj 4h->h
    return 1.02 * 2 * n + 14 * adapters


def _room(method: str, b: int, h: int, d: int) -> int:
    """The bytes a rung's chunks may take, for the first guess: B + H + D; for LoRA H + D less
    about the read-ahead window (H / 8) with a disk tier, since a frozen chunk keeps its host or
    disk payload while it is on the accelerator (docs/gemini.md, frozen parameters)."""
    if method == "full":
        return b + h + d
    return h + d - (h // 8 if d else 0)


def run(quick: bool, out_dir: Path) -> Any:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from colossal_zero import chunk_bytes_per_param

    from _report import Report

    b, h, d = budgets(quick)
    load_before = os.getloadavg()[0]
    per_param = {
        "lora": chunk_bytes_per_param(PRECISION, frozen=True),
        "full": chunk_bytes_per_param(PRECISION),
    }
    report = Report(
        name="lora_capacity",
        title=f"Largest GPT that fine-tunes 3 steps with LoRA r{RANK} vs full fine-tuning under "
        f"Gemini in an emulated {b // MiB} MiB accelerator tier + {h // MiB} MiB host "
        f"(+ {d // MiB} MiB disk)",
        columns=["method", "disk", "depth", "width", "params", "trainable", "of_limit", "acc_peak_MiB",
                 "host_peak_MiB", "disk_peak_MiB", "frozen_B_per_param", "moved_MiB_per_step",
                 "step_s", "rss_peak_MiB", "trials"],
    )  # fmt: skip
    t_start, trials = time.perf_counter(), [0]
    best: dict[tuple[str, bool], dict[str, Any]] = {}
    log: list[str] = []
    searches = [(m, disk) for disk in (False, True) for m in ("full", "lora")]
    with Progress(
        TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), transient=False
    ) as progress:
        for method, disk in searches:
            room = b + h + (d if disk else 0)
            limit = room / per_param[method]
            rungs = ladder(limit / 4, limit)
            label = f"{method} {'+ disk' if disk else 'no disk'}"
            first = _room(method, b, h, d if disk else 0)
            guess = max(
                [0] + [i for i, r in enumerate(rungs) if _predicted_bytes(method, *r[1:]) <= first]
            )
            steps = 3
            task = progress.add_task(f"{label}: {len(rungs)} rungs", total=steps)
            n_trials = [0]

            def fits(rung, method=method, disk=disk, task=task, label=label, n=n_trials):  # type: ignore[no-untyped-def]
                params, depth, width = rung
                progress.update(
                    task, description=f"{label}: trying {depth}x{width} ({params / 1e6:.1f}M)"
                )
                spec = {"method": method, "depth": depth, "width": width, "b": b, "h": h,
                        "d": d if disk else 0}  # fmt: skip
                got = _run_child("trial", spec)
                trials[0] += 1
                n[0] += 1
                progress.advance(task)
                verdict = "fits" if got.get("fits") else f"does not fit ({got.get('why', '')})"
                log.append(f"{label} {depth}x{width} {params / 1e6:.1f}M: {verdict}")
                progress.console.print(f"  {log[-1]}")
                return got

            found = _search(rungs, fits, guess)
            progress.update(
                task, total=n_trials[0], completed=n_trials[0], description=f"{label}: done"
            )
            if found is None:
                continue
            (params, depth, width), fig = found
            best[(method, disk)] = {**fig, "depth": depth, "width": width, "params": params}
            report.rows.append(
                {"method": f"Gemini {'LoRA r8' if method == 'lora' else 'full fine-tune'}",
                 "disk": f"{d // MiB} MiB" if disk else "-", "depth": depth, "width": width,
                 "params": params, "trainable": fig["trainable_params"],
                 "of_limit": params / limit,
                 "acc_peak_MiB": fig["acc_peak_MiB"], "host_peak_MiB": fig["host_peak_MiB"],
                 "disk_peak_MiB": fig["disk_peak_MiB"],
                 "frozen_B_per_param": fig["frozen_chunk_bytes_per_frozen_param"],
                 "moved_MiB_per_step": fig["moved_MiB_per_step"], "step_s": fig["step_s"],
                 "rss_peak_MiB": fig["rss_peak_MiB"], "trials": n_trials[0]}
            )  # fmt: skip
        timing: dict[str, Any] = {}
        lora_fit = best.get(("lora", False))
        if lora_fit and os.environ.get("BENCH_LORA_STEP_TIME", "1") != "0":
            task = progress.add_task(
                f"step time: Gemini LoRA vs plain peft at {lora_fit['depth']}x{lora_fit['width']}",
                total=1,
            )
            spec = {"method": "lora", "depth": lora_fit["depth"], "width": lora_fit["width"],
                    "b": b, "h": h, "d": 0}  # fmt: skip
            timing = _run_child("time", spec)
            progress.advance(task)
    _summarise(report, best, timing, b, h, d, per_param, load_before)
    report.summary["search: trials, minutes"] = (
        f"{trials[0]}, {(time.perf_counter() - t_start) / 60:.1f}"
    )
    report.summary["trials"] = "; ".join(log)
    return report


def _summarise(report, best, timing, b, h, d, per_param, load_before) -> None:  # type: ignore[no-untyped-def]
    from _report import load_note

    for disk in (False, True):
        tag = "with disk" if disk else "no disk"
        room = b + h + (d if disk else 0)
        full = best.get(("full", disk), {}).get("params", 0)
        lora = best.get(("lora", disk), {}).get("params", 0)
        report.summary[f"largest full fine-tune params, {tag}"] = full
        report.summary[f"largest LoRA params, {tag}"] = lora
        report.summary[f"LoRA / full, {tag}"] = lora / full if full else float("nan")
        report.summary[f"aim: LoRA >= 6x full, {tag}"] = bool(full) and lora >= 6 * full
        report.summary[f"LoRA / its limit (B+H{'+D' if disk else ''}) / 2 B, {tag}"] = lora / (
            room / per_param["lora"]
        )
        report.summary[f"full / its limit (B+H{'+D' if disk else ''}) / 14 B, {tag}"] = full / (
            room / per_param["full"]
        )
        fit = best.get(("lora", disk))
        if fit:
            spread = ", ".join(
                f"{k} {v:.3f}" for k, v in sorted(fit["where"].items()) if v >= 0.001
            )
            report.summary[f"chunk bytes per param at the largest LoRA fit, {tag}"] = spread
            report.summary[f"frozen chunk bytes written, {tag} (MiB)"] = fit["frozen_written_MiB"]
    if timing:
        summarise_timing(report, timing)
    else:
        report.summary["step time"] = "not run here: python benchmarks/run.py lora_step_time"
    report.notes = [
        "Accelerator emulated on the CPU: the accelerator, host and disk budgets are the chunk "
        "manager's accounting of chunk payloads (a move past one is a CapacityError); figures "
        "are labelled emulated accelerator tier. acc_peak_MiB is chunk bytes alone (per-moment "
        "planning keeps each moment's measured non-model bytes free beside them).",
        f"{PRECISION} compute precision; LoRA through peft (colossal.lora.apply_lora: rank {RANK}, "
        "alpha 8, attn and mlp linear layers; every base weight frozen in Gemini's frozen chunks: "
        "its bf16 value only), full fine-tuning with fp32 masters and AdamW states (14 B a "
        "parameter); torch AdamW wrapped by GeminiOptimizer; batch 1 x 8 tokens, byte "
        "vocabulary; GPT blocks activation-checkpointed (so activations never bound depth).",
        "Each trial (3 steps: one warmup step, traced, and 2 measured ones) runs in its own "
        "subprocess; "
        "rss_peak_MiB is that process's peak resident set (it includes the fp32 model built "
        "before Gemini takes it, which the budgets do not count).",
        *([timing_note() + " Timed at the largest LoRA fit without disk."] if timing else []),
        load_note(load_before, "the machine is shared with other jobs: step times move with it"),
    ]
