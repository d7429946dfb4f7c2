"""The moonshot, on the machine it runs on: the largest GPT that ``colossal train`` (the command)
trains 3 steps in bf16 at batch 1 with ``--host-budget`` and ``--disk-budget`` set from the
machine (RAM and free disk, each minus a stated margin), against ``colossal plan``'s prediction
of the same run; the largest model whose disk tier and checkpoint fit the free disk together,
saved after step 3 and resumed one step exactly; Colossal-AI's claims replayed in emulation (a
6 GiB accelerator plus the host trains a GPT of >= 1.5B parameters) and the planner's answer for
a 24 GiB RTX 3090 with 64 GiB host.

Models are GPT-2 ``config.json`` files of a fixed width and a searched depth, trained as
themselves through ``--model hf:PATH`` (built lazily from the config). Each trial is one
``colossal train`` process (``_box_capacity_job``); the planner is ``colossal.plan`` on this
machine's ``--calibrate`` profile (``_box_capacity_plan``). ``--quick`` runs the same flow with
small fixed budgets.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

import psutil
from _box_capacity_job import dir_bytes, disk_rates, gpt2_config, gpt2_params, peaks, train
from _box_capacity_notes import full_estimate, notes
from _box_capacity_plan import (
    best_gemini,
    bf16_rate,
    box_hardware,
    claim,
    largest_depth,
    prediction,
    process_baseline,
)
from _capacity_disk_baselines import _sequential

from _report import Report, load_note

MiB, GiB = 2**20, 2**30
# Python, torch, activations, the page cache the disk tier streams through (and whatever else
# runs on the machine: BENCH_BOX_RAM_MARGIN_GIB widens it)
RAM_MARGIN = float(os.environ.get("BENCH_BOX_RAM_MARGIN_GIB", 5)) * GiB
DISK_MARGIN = 8 * GiB  # the filesystem and other users of the disk
CKPT_BYTES_PER_PARAM = (
    13  # a sharded bf16 Gemini checkpoint: 12 measured (fp32 masters, Adam) + 1 spare
)
CLAIM_PARAMS_PER_BYTE = 1.5e9 / (6 * GiB)  # Colossal-AI: an RTX 2060 (6 GiB) trains 1.5B

_COLUMNS = [
    "part",
    "depth",
    "width",
    "params",
    "trained",
    "B_MiB",
    "H_MiB",
    "D_MiB",
    "step_s",
    "plan_step_s",
    "step_err",
    "peak_rss_MiB",
    "peak_anon_MiB",
    "plan_model_MiB",
    "plan_memory_MiB",
    "memory_err",
    "anon_err",
    "tiers_acc_host_MiB",
    "tiers_err",
    "disk_peak_MiB",
    "plan_disk_MiB",
    "disk_read_MiB_per_step",
    "disk_written_MiB_per_step",
    "tier_read_MiB_s",
    "tier_write_MiB_s",
    "proc_read_MiB_s",
    "proc_write_MiB_s",
    "seq_read_MiB_s",
    "seq_write_MiB_s",
    "wall_s",
    "why",
]


def _settings(quick: bool, where: Path) -> dict:
    """Budgets, shapes and limits: from the machine for a full run, small and fixed for quick."""
    if quick:
        return dict(
            b=8 * MiB, h=32 * MiB, d=128 * MiB, width=256, seq=16, trials=2, timeout=240,
            emu_b=8 * MiB, seq_cap=64 * MiB,
        )  # fmt: skip
    usable = psutil.virtual_memory().total - RAM_MARGIN
    b = 2 * GiB
    free = shutil.disk_usage(where).free - DISK_MARGIN
    return dict(
        b=b, h=usable - b, d=free, width=3072, seq=int(os.environ.get("BENCH_BOX_SEQ", 16)),
        trials=4, timeout=int(os.environ.get("BENCH_BOX_TIMEOUT_S", 48 * 3600)),
        emu_b=6 * GiB, seq_cap=2 * GiB,
    )  # fmt: skip


def _common(s: dict, where: Path, corpus: Path) -> list[str]:
    return [
        "--batch-size", "1", "--seq-len", str(s["seq"]), "--precision", "bf16",
        "--plugin", "gemini", "--data", str(corpus), "--disk-dir", str(where / "tier"),
        "--export", "none", "--val-fraction", "0.05",
    ]  # fmt: skip


def _budgets(b: int, h: int, d: int) -> list[str]:
    return ["--accelerator-budget", str(b), "--host-budget", str(h), "--disk-budget", str(d)]


def _err(measured: float, predicted: float) -> float:
    return (predicted - measured) / measured if measured else float("nan")


def _trial(part: str, depth: int, s: dict, b: int, h: int, d: int, ctx: dict) -> dict:
    """One capacity trial: 3 steps, killed before its final save; its row."""
    where, hw = ctx["where"], ctx["hw"]
    cfg = gpt2_config(where / "configs", layers=depth, width=s["width"], seq_len=s["seq"])
    out = where / f"run-{part.split(':')[0].replace(' ', '-')}-{depth}"
    (where / "tier").mkdir(exist_ok=True)
    args = ["--model", f"hf:{cfg}", *_common(s, where, ctx["corpus"]), *_budgets(b, h, d)]
    args.append("--no-final-save")  # killed after step 3 anyway: no save if it outruns the kill
    job = train(
        args, out, steps=3, stop_after=True, timeout_s=s["timeout"], log=where / f"{out.name}.log"
    )
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(where / "tier", ignore_errors=True)
    plan = best_gemini(replace(hw, memory=b, host_memory=h, disk=d), cfg, seq_len=s["seq"])
    pred = prediction(plan, ctx["baseline"]) if plan else {}
    row = {
        "part": part, "depth": depth, "width": s["width"],
        "params": gpt2_params(depth, s["width"], s["seq"]), "trained": job.ok,
        "B_MiB": b / MiB, "H_MiB": h / MiB, "D_MiB": d / MiB, "wall_s": job.wall_s,
        "why": job.why or "", "plan_layout": pred.get("layout", "does not fit"),
    }  # fmt: skip
    if not job.ok:
        return row
    rates, pk = disk_rates(job.records), peaks(job.records)
    steps_s = sum(r["step_time_s"] for r in job.records)
    row.update(
        step_s=rates["step_s"],
        peak_rss_MiB=job.peak_rss / MiB,
        peak_anon_MiB=job.peak_anon / MiB,
        tiers_acc_host_MiB=pk["accelerator_peak_MiB"] + pk["host_peak_MiB"],
        disk_peak_MiB=pk["disk_peak_MiB"],
        disk_read_MiB_per_step=rates["disk_read_MiB_per_step"],
        disk_written_MiB_per_step=rates["disk_written_MiB_per_step"],
        tier_read_MiB_s=rates["tier_read_MiB_s"],
        tier_write_MiB_s=rates["tier_write_MiB_s"],
        proc_read_MiB_s=job.io_read / steps_s / MiB,  # the whole process's, setup included
        proc_write_MiB_s=job.io_written / steps_s / MiB,
        losses=[r["loss"] for r in job.records],
    )
    if pred:
        row.update(
            plan_step_s=pred["step_s"],
            step_err=_err(row["step_s"], pred["step_s"]),
            plan_model_MiB=pred["model_memory"] / MiB,
            plan_memory_MiB=pred["memory"] / MiB,
            memory_err=_err(row["peak_rss_MiB"], pred["memory"] / MiB),
            anon_err=_err(row["peak_anon_MiB"], pred["memory"] / MiB),
            tiers_err=_err(row["tiers_acc_host_MiB"], pred["model_memory"] / MiB),
            plan_disk_MiB=pred["disk"] / MiB,
        )
    nbytes = int(min(s["seq_cap"], max(16 * MiB, rates["disk_written_MiB_per_step"] * MiB)))
    row["seq_write_MiB_s"], row["seq_read_MiB_s"] = _sequential(where, nbytes)
    return row


def _search(s: dict, ctx: dict, report: Report) -> dict | None:
    """The planner's largest depth first, then down (failed) or up toward the (B+H+D)/16 bound
    (trained), at most ``trials`` trials; the largest that trained."""
    b, h, d, w = s["b"], s["h"], s["d"], s["width"]
    bound = max(k for k in range(1, 4096) if gpt2_params(k, w, s["seq"]) * 16 <= b + h + d)
    # the first trial at most 95% of the bound: chunks fragment the last few percent (quick:
    # 98.6% finds no tier with room for one chunk) and a failed full-size trial costs hours
    near = max(k for k in range(1, 4096) if gpt2_params(k, w, s["seq"]) * 16 <= 0.95 * (b + h + d))
    depth, best, lo, hi = min(ctx["plan_depth"], near), None, 0, bound
    for _ in range(s["trials"]):
        row = _trial("capacity", depth, s, b, h, d, ctx)
        report.rows.append(row)
        if row["trained"]:
            best, lo = row, depth
        else:
            hi = depth - 1
        nxt = (lo + hi + 1) // 2 if row["trained"] else max(1, min(hi, round(depth * 0.92)))
        if nxt <= lo or nxt > hi or nxt == depth:
            break
        depth = nxt
    return best


def _checkpoint(s: dict, ctx: dict, report: Report) -> None:
    """The largest model whose tier and checkpoint fit D together: 4 steps planned, saved after
    step 3 (``--checkpoint-every 3``) and stopped after step 4 before its final save (the
    uninterrupted run), then resumed from the step-3 checkpoint to step 4 (the learning-rate
    schedule depends on ``--steps``: both runs plan 4)."""
    b, h, d, w, where = s["b"], s["h"], s["d"], s["width"], ctx["where"]
    room = 0.85 * (b + h + d) / (16 + CKPT_BYTES_PER_PARAM)
    depth = max(k for k in range(1, 4096) if gpt2_params(k, w, s["seq"]) <= room)
    params = gpt2_params(depth, w, s["seq"])
    tier_d = int(d - CKPT_BYTES_PER_PARAM * params)
    cfg = gpt2_config(where / "configs", layers=depth, width=w, seq_len=s["seq"])
    args = ["--model", f"hf:{cfg}", *_common(s, where, ctx["corpus"]), *_budgets(b, h, tier_d)]
    out, jobs = where / "ckpt-run", {}
    for name, extra in (("straight", ["--checkpoint-every", "3"]), ("resumed", ["--resume"])):
        (where / "tier").mkdir(exist_ok=True)
        jobs[name] = train([*args, *extra], out, steps=4, stop_after=True,
                           timeout_s=s["timeout"], log=where / f"ckpt-{name}.log")  # fmt: skip
        if name == "straight":
            ckpt = dir_bytes(out / "checkpoint" / "step-3")
            straight = [r["loss"] for r in jobs[name].records]
            _back_to_step3(out)
        shutil.rmtree(where / "tier", ignore_errors=True)
    lost = {k: j.why for k, j in jobs.items() if not j.ok}
    resumed = [r["loss"] for r in jobs["resumed"].records]
    exact = not lost and len(resumed) == 4 and resumed == straight[:4]
    report.rows.append({
        "part": "checkpoint: save at 3, resume 1", "depth": depth, "width": w,
        "params": params, "trained": not lost, "B_MiB": b / MiB, "H_MiB": h / MiB,
        "D_MiB": tier_d / MiB, "wall_s": sum(j.wall_s for j in jobs.values()),
        "peak_rss_MiB": max(j.peak_rss for j in jobs.values()) / MiB,
        "why": "; ".join(f"{k}: {v}" for k, v in lost.items()),
    })  # fmt: skip
    report.summary.update({
        "checkpoint: params": params,
        "checkpoint: tier disk budget + checkpoint bytes (MiB)": f"{tier_d / MiB:.0f} + "
        f"{ckpt / MiB:.0f} of {d / MiB:.0f} free",
        "checkpoint: bytes per parameter (measured)": ckpt / params,
        "checkpoint: losses uninterrupted": straight,
        "checkpoint: losses resumed (steps 1-3 read back, 4 trained after the resume)": resumed,
        "aim: resumed step equals the uninterrupted run's exactly": exact,
    })  # fmt: skip
    shutil.rmtree(out, ignore_errors=True)


def _back_to_step3(out: Path) -> None:
    """Leave only the step-3 checkpoint and steps 1-3 of the metrics in ``out``: the kill after
    step 4 can come after the job's final save began or even ended (the poll is 0.2 s). With no
    ``latest`` the newest complete ``step-<N>`` is resumed (colossal's [Note: atomic
    checkpoints]), so the resumed job must train step 4 itself to write its record."""
    root = out / "checkpoint"
    for p in root.glob("*step-4*"):
        shutil.rmtree(p, ignore_errors=True)
    (root / "latest").unlink(missing_ok=True)
    metrics = out / "metrics.jsonl"
    if metrics.exists():
        metrics.write_text("".join(metrics.read_text().splitlines(keepends=True)[:3]))


def _emulation(s: dict, ctx: dict, report: Report) -> None:
    """Colossal-AI's RTX 2060 claim: an emulated accelerator of ``emu_b`` plus the host (and the
    disk where host RAM alone is short) trains a GPT of >= 1.5B params per 6 GiB, 3 steps."""
    b, w = s["emu_b"], s["width"]
    want = CLAIM_PARAMS_PER_BYTE * b
    depth = min(k for k in range(1, 4096) if gpt2_params(k, w, s["seq"]) >= want)
    h = s["b"] + s["h"] - b  # the accelerator is emulated in the same RAM
    row = _trial("emulated claim: accelerator + host", depth, s, b, h, s["d"], ctx)
    report.rows.append(row)
    report.summary["emulated claim: params wanted (1.5B per 6 GiB of accelerator)"] = int(want)
    report.summary["aim: emulated accelerator + host trains the claim's size"] = row["trained"]


def run(quick: bool, out_dir: Path) -> Report:
    load_before = os.getloadavg()[0]
    where = Path(tempfile.mkdtemp(prefix="bench-box-", dir=os.environ.get("BENCH_BOX_DIR")))
    s = _settings(quick, where)
    report = Report(
        name="box_capacity",
        title=f"Largest GPT colossal train trains 3 steps (bf16, batch 1 x {s['seq']}) in "
        f"B {s['b'] / MiB:.0f} MiB (emulated) + H {s['h'] / MiB:.0f} MiB + D {s['d'] / MiB:.0f} MiB",
        columns=_COLUMNS,
    )
    try:
        corpus = where / "corpus.txt"
        corpus.write_text("".join(Path(m.__file__).read_text() for m in (json, shutil, tempfile)))
        (where / "tier").mkdir()
        hw, prof = box_hardware(width=s["width"], seq_len=s["seq"], accelerator=s["b"],
                                host=s["h"], disk=s["d"], disk_dir=where, quick=quick)  # fmt: skip
        plan_depth = largest_depth(hw, width=s["width"], seq_len=s["seq"], scratch=where / "p")
        baseline = process_baseline()
        ctx = dict(
            where=where, hw=hw, corpus=corpus, plan_depth=max(1, plan_depth), baseline=baseline
        )
        best = _search(s, ctx, report)
        limit = (s["h"] + s["d"]) / 16
        report.summary.update({
            "B, H, D (MiB)": f"{s['b'] / MiB:.0f}, {s['h'] / MiB:.0f}, {s['d'] / MiB:.0f}",
            "margins kept free (GiB)": "quick: fixed budgets" if quick else
            f"RAM {RAM_MARGIN / GiB:g}, disk {DISK_MARGIN / GiB:g}",
            "planner's largest depth (width)": f"{plan_depth} ({s['width']}): "
            f"{gpt2_params(plan_depth, s['width'], s['seq']):,} params",
            "largest trained params": best["params"] if best else 0,
            "(H + D) / 16 B per param": int(limit),
            "largest / ((H + D) / 16)": (best["params"] / limit) if best else 0.0,
            "process baseline (MiB; torch, transformers, colossal loaded)": baseline / MiB,
            "aim: >= 85% of (H + D) / 16": bool(best and best["params"] >= 0.85 * limit),
        })  # fmt: skip
        if best and "plan_step_s" in best:
            report.summary["aim: plan memory within 10% of peak RSS"] = (
                abs(best["memory_err"]) <= 0.1
            )
            report.summary["plan memory vs peak anonymous memory (file pages left out)"] = best[
                "anon_err"
            ]
            report.summary["aim: plan step time within 30%"] = abs(best["step_err"]) <= 0.3
        if best and quick:
            full = _settings(False, where)
            report.summary["full run, estimated from this one"] = full_estimate(
                best, s, full, bf16_rate(full["seq"], full["width"])
            )
        _checkpoint(s, ctx, report)
        _emulation(s, ctx, report)
        for hw_name, host, width in (
            ("rtx3090-24g", 64 * GiB, 5120),
            ("rtx2060-6g", 16 * GiB, 2048),
        ):
            c = claim(hw_name, host, width=width, seq_len=1024, scratch=where / "p")
            report.summary[f"planner: largest GPT on 1 x {hw_name} + {host // GiB} GiB host"] = (
                f"{c['params'] / 1e9:.2f}B ({c.get('depth')} x {width}, {c['layout']}, "
                f"batch 1 x 1024)"
            )
        report.summary["calibrated profile"] = json.dumps(
            {
                k: prof[k]
                for k in ("flops", "matmul_mode", "copy_bw", "disk_write_bw", "disk_read_bw")
            }
        )
    finally:
        shutil.rmtree(where, ignore_errors=True)
    report.notes += [*notes(quick, s), load_note(load_before)]
    return report
