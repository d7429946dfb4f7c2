"""memtrace: hook-tracer overhead on a training step, and static-estimate error per GPT preset.

Overhead: the same GPT step (forward, backward, AdamW) timed plain and under the hook tracer with
the live-tensor tracker, alternating side by side in one run; the ratio of the medians is reported.
Estimate: the peak of a training step predicted on the meta device vs the exact live-tensor peak of
the same step run on the CPU.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch

from colossal_memtrace import HookTracer, estimate_step, plot_timeline, run_step, trace_step
from colossal_models import GPT, GPTConfig

from _report import Report

MIB = 1024 * 1024


def _inputs(cfg: GPTConfig, batch: int, seq: int):
    def make(device: torch.device):
        g = torch.Generator().manual_seed(0)
        idx = torch.randint(0, cfg.vocab_size, (batch, seq), generator=g)
        return idx.to(device), idx.roll(-1, 1).to(device)

    return make


def _overhead(preset: str, batch: int, seq: int, reps: int) -> dict:
    cfg = GPTConfig.preset(preset)
    torch.manual_seed(0)
    model = GPT(cfg)
    opt = torch.optim.AdamW(model.parameters())
    inputs = _inputs(cfg, batch, seq)(torch.device("cpu"))

    def plain_step() -> float:
        t0 = time.perf_counter()
        run_step(model, inputs, optimizer=opt)
        return time.perf_counter() - t0

    def traced_step() -> tuple[float, HookTracer]:
        tracer = HookTracer(model, optimizer=opt)  # made once per run by a user: not timed
        t0 = time.perf_counter()
        with tracer.step():  # hooks, dispatch mode, tracking, moments: all a warmup step does
            run_step(model, inputs, optimizer=opt)
        return time.perf_counter() - t0, tracer

    plain_step()  # warm both sides: allocator, optimizer state, first-call paths
    traced_step()
    plain, traced = [], []
    for i in range(reps):
        if i % 2:  # alternate which side goes first, so neither always follows the other
            t, tracer = traced_step()
            plain.append(plain_step())
        else:
            plain.append(plain_step())
            t, tracer = traced_step()
        traced.append(t)
    p, t = statistics.median(plain), statistics.median(traced)
    return {
        "what": "overhead", "preset": preset, "batch": batch, "seq_len": seq,
        "plain_ms": 1e3 * p, "traced_ms": 1e3 * t, "overhead_ratio": t / p,
        "moments": tracer.stats.num_moments(),
    }  # fmt: skip


def _estimate(name: str, cfg: GPTConfig, batch: int, seq: int, out_dir: Path | None) -> dict:
    make = _inputs(cfg, batch, seq)
    torch.manual_seed(0)
    model = GPT(cfg)
    opt = torch.optim.AdamW(model.parameters())
    measured = trace_step(model, make(torch.device("cpu")), optimizer=opt)
    est = estimate_step(lambda: GPT(cfg), make, build_optimizer=torch.optim.AdamW)
    row = {
        "what": "estimate", "preset": name, "batch": batch, "seq_len": seq,
        "layers": cfg.num_layers, "hidden": cfg.hidden_size,
        "measured_peak_MiB": measured.peak_bytes() / MIB, "estimated_peak_MiB": est.peak_bytes() / MIB,
        "estimate_ratio": est.peak_bytes() / measured.peak_bytes(),
        "nonmodel_ratio": est.peak_non_model() / max(1, measured.peak_non_model()),
        "moments": measured.num_moments(),
    }  # fmt: skip
    if out_dir is not None:
        plot_timeline(measured, out_dir / "memtrace_timeline.png")
    return row


def run(quick: bool, out_dir: Path) -> Report:
    out_dir.mkdir(parents=True, exist_ok=True)
    report = Report(
        name="memtrace",
        title="memtrace: hook-tracer overhead and static-estimate error",
        columns=["what", "preset", "layers", "hidden", "batch", "seq_len", "plain_ms", "traced_ms",
                 "overhead_ratio", "measured_peak_MiB", "estimated_peak_MiB", "estimate_ratio",
                 "nonmodel_ratio", "moments"],
    )  # fmt: skip
    cases = [("nano", 4, 64), ("micro", 4, 128), ("tiny", 4, 256)]
    if not quick:
        cases += [("mini", 4, 256), ("tiny-wide", 2, 256)]
    for name, batch, seq in cases:
        cfg = GPTConfig.preset(name.split("-")[0])
        if name == "tiny-wide":
            cfg = replace(cfg, num_layers=2, hidden_size=512, num_heads=8)
        report.rows.append(_estimate(name, cfg, batch, seq, out_dir if name == "tiny" else None))
    over = [("tiny", 8, 256, 5 if quick else 9)]
    if not quick:
        over += [("micro", 8, 128, 15), ("mini", 4, 256, 7)]
    for preset, batch, seq, reps in over:
        report.rows.append(_overhead(preset, batch, seq, reps))
    est = [r["estimate_ratio"] for r in report.rows if r["what"] == "estimate"]
    ovh = {r["preset"]: r["overhead_ratio"] for r in report.rows if r["what"] == "overhead"}
    report.summary = {
        **{f"overhead_ratio ({k}, traced/plain)": v for k, v in ovh.items()},
        "overhead aim <= 1.10 met (tiny)": ovh["tiny"] <= 1.10,
        "overhead aim <= 1.10 met on every preset": all(o <= 1.10 for o in ovh.values()),
        "worst |estimate/measured - 1|": max(abs(e - 1) for e in est),
        "estimate within 10% on every preset": all(abs(e - 1) <= 0.10 for e in est),
    }
    report.notes = [
        "Accelerator tier emulated: compute on the CPU, bytes counted exactly by the live-tensor "
        "tracker (a torch dispatch mode with weak-reference callbacks on storages), so measured peaks are exact "
        "tensor bytes, not RSS.",
        "Each traced step installs the hooks and the dispatch mode afresh (what a warmup step "
        "costs); steady-state steps after warmup run untraced and cost nothing extra. Only "
        "HookTracer(...) itself (a few attribute assignments, made once per run) is outside the "
        "timed region.",
        "Overhead method: one untimed plain step and one untimed traced step first (both sides "
        "warmed; before 2026-11-29 only the plain side was), then reps alternating which side "
        "runs first; ratio of the medians. micro (about 500 operators in ~30 ms) shows the per-"
        "operator cost of any Python dispatch mode: a dispatch mode that does nothing already "
        "costs about 1.1-1.3x there; tiny and mini amortise it.",
        "The shared 2-core machine is noisy (single steps vary by 2x under others' load), so "
        "compare ratios of one run, not milliseconds across runs.",
        "Static estimate: the same step on the meta device through the same tracer; attention "
        "calls the fused CPU kernel on meta so both hold the same tensors.",
        "Peaks include the AdamW step (params + grads + states + update temporaries).",
    ]
    report.figures = ["memtrace_timeline.png"]
    return report
