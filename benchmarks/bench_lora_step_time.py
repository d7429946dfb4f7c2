"""LoRA step time alone: Gemini LoRA (rank 8, bf16) under the accelerator and host budgets of
``lora_capacity`` against plain ``peft`` on one process, at the largest LoRA fit that
``lora_capacity`` found without a disk tier (read from its results file), one step of each in
turn. The step-time part of ``lora_capacity`` without its capacity search, so that it can be
rerun cheaply (on a quiet machine):

    python benchmarks/run.py lora_step_time [--quick]

``BENCH_LORA_TIME_MODEL=DEPTHxWIDTH`` times another GPT; ``BENCH_LORA_TIME_STEPS`` sets the
number of timed pairs (default 5).
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path
from typing import Any

from _lora_capacity_runs import PRECISION, RANK, TIME_STEPS

MiB = 2**20
RESULTS = Path(__file__).resolve().parent / "results"


def budgets(quick: bool) -> tuple[int, int, int]:
    """``lora_capacity``'s B, H, D."""
    return (8 * MiB, 64 * MiB, 64 * MiB) if quick else (32 * MiB, 512 * MiB, 256 * MiB)


def _model(quick: bool) -> tuple[int, int, str]:
    """(depth, width, where it came from): the environment's, else the largest LoRA fit without
    disk in ``lora_capacity``'s results."""
    given = os.environ.get("BENCH_LORA_TIME_MODEL")
    if given:
        depth, width = (int(v) for v in given.lower().split("x"))
        return depth, width, "BENCH_LORA_TIME_MODEL"
    name = "lora_capacity_quick.json" if quick else "lora_capacity.json"
    path = RESULTS / name
    if not path.exists():
        raise SystemExit(
            f"{path} is missing: run `python benchmarks/run.py lora_capacity"
            f"{' --quick' if quick else ''}` first, or set BENCH_LORA_TIME_MODEL=DEPTHxWIDTH"
        )
    rows = json.loads(path.read_text())["rows"]
    row = next(r for r in rows if r["method"].startswith("Gemini LoRA") and r["disk"] == "-")
    return int(row["depth"]), int(row["width"]), f"the LoRA fit without disk in {name}"


def summarise_timing(report: Any, timing: dict[str, Any]) -> None:
    """The step-time figures of a ``time`` trial into ``report.summary``."""
    if "gemini_step_s" not in timing:
        report.summary["step time trial"] = f"failed: {timing.get('why')}"
        return
    ratio = statistics.median(timing["ratios"])  # pairs are adjacent: load drift cancels
    report.summary["step time, Gemini LoRA (B, H) / plain peft, median of per-pair ratios"] = (
        f"{ratio:.3f} (median steps {timing['gemini_step_s']:.2f} s vs "
        f"{timing['plain_step_s']:.2f} s; per pair "
        f"{', '.join(f'{r:.2f}' for r in timing['ratios'])})"
    )
    report.summary["aim: step time <= 1.10x plain peft"] = ratio <= 1.10
    report.summary["max |loss difference| Gemini vs plain peft (both bf16)"] = timing[
        "max_loss_diff"
    ]


def timing_note() -> str:
    return (
        "Step time: Gemini LoRA under B and H (no disk) against plain peft on one process with "
        "no budget (the same bf16 base, adapters in fp32 as peft keeps them, torch AdamW, the "
        "same batch), one step of each in turn (order swapped every pair) after a warmup pair, "
        f"{TIME_STEPS} pairs; the median of the per-pair ratios (each pair's two steps are "
        "adjacent in time, so the shared machine's load drift cancels more than in a ratio of "
        "medians)."
    )


def run(quick: bool, out_dir: Path) -> Any:
    from bench_lora_capacity import _run_child

    from _report import Report, load_note

    b, h, _ = budgets(quick)
    depth, width, source = _model(quick)
    load_before = os.getloadavg()[0]
    report = Report(
        name="lora_step_time",
        title=f"Step time of GPT {depth} x {width} with LoRA r{RANK} under Gemini in an emulated "
        f"{b // MiB} MiB accelerator tier + {h // MiB} MiB host against plain peft",
        columns=["depth", "width", "gemini_step_s", "plain_step_s", "median_pair_ratio",
                 "rss_peak_MiB"],
    )  # fmt: skip
    spec = {"method": "lora", "depth": depth, "width": width, "b": b, "h": h, "d": 0}
    timing = _run_child("time", spec)
    if "gemini_step_s" in timing:
        report.rows.append(
            {"depth": depth, "width": width, "gemini_step_s": timing["gemini_step_s"],
             "plain_step_s": timing["plain_step_s"],
             "median_pair_ratio": statistics.median(timing["ratios"]),
             "rss_peak_MiB": timing["rss_peak_MiB"]}
        )  # fmt: skip
    summarise_timing(report, timing)
    report.notes = [
        f"The model: {source}. {PRECISION} compute precision; accelerator emulated on the CPU.",
        timing_note(),
        load_note(load_before, "the machine is shared with other jobs: step times move with it"),
    ]
    return report
