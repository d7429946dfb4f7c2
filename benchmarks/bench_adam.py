"""Host Adam step: colossal-zero's fused hybrid update on a flat fp32 shard against
``torch.optim.AdamW`` (fused, foreach, per-tensor) and against the machine's copy bandwidth,
all measured in the same run."""

from __future__ import annotations

import itertools
import statistics
import time
from pathlib import Path

import torch

from colossal_zero import AdamHyper, adamw_update

from _report import Report

BYTES_PER_PARAM = 28  # reads p, g, m, v (4 x 4 B) and writes p, m, v (3 x 4 B), fp32


def _median_time(fn, repeats: int) -> float:  # type: ignore[no-untyped-def]
    fn()  # warm up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _copy_bandwidth(numel: int, repeats: int) -> float:
    """Bytes per second of the faster of a copy and a triad ``c = a + s * b`` over ``numel``
    fp32 elements, counting the write-allocate read of every destination line (a store to a line
    not in cache reads it first): 3 and 4 transfers per element. Adam's stores go to lines it has
    just read, so its 28 bytes per parameter need no such extra reads."""
    a, b, c = torch.randn(numel), torch.randn(numel), torch.empty(numel)
    t_copy = _median_time(lambda: c.copy_(a), repeats)
    t_triad = _median_time(lambda: torch.add(a, b, alpha=0.5, out=c), repeats)
    return max(3 * numel * 4 / t_copy, 4 * numel * 4 / t_triad)


def _ours(numel: int, tensors: int, repeats: int) -> float:
    flat = torch.randn(numel)
    grad, m, v = torch.randn(numel), torch.zeros(numel), torch.zeros(numel)
    step = torch.zeros(())
    bounds = torch.linspace(0, numel, tensors + 1).long().tolist()
    views = [[t[a:b] for a, b in itertools.pairwise(bounds)] for t in (flat, grad, m, v)]
    hyper = AdamHyper(lr=1e-3, weight_decay=0.01)

    def step_fn() -> None:
        step.add_(1)
        adamw_update(*views, [step] * tensors, hyper)

    return _median_time(step_fn, repeats)


def _torch(numel: int, tensors: int, repeats: int, **flags: bool) -> float:
    size = numel // tensors
    params = [torch.nn.Parameter(torch.randn(size)) for _ in range(tensors)]
    for p in params:
        p.grad = torch.randn(size)
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01, **flags)
    return _median_time(opt.step, repeats)


def run(quick: bool, out_dir: Path) -> Report:
    sizes = [1 << 22] if quick else [1 << 22, 1 << 25]
    repeats = 5 if quick else 10
    tensors = 64  # a shard holds many parameters' slices: one kernel call covers them all
    report = Report(
        name="adam",
        title="Host Adam step: colossal-zero hybrid Adam vs torch.optim.AdamW, params/s",
        columns=[
            "params",
            "method",
            "step_ms",
            "Mparams_per_s",
            "vs_torch_fused",
            "bandwidth_fraction",
        ],
    )
    bw = _copy_bandwidth(1 << 25, repeats)
    for n in sizes:
        rows = {
            "colossal hybrid (fused CPU kernel)": _ours(n, tensors, repeats),
            "torch AdamW fused=True": _torch(n, tensors, repeats, fused=True),
            "torch AdamW foreach=True": _torch(n, tensors, repeats, foreach=True),
            "torch AdamW per-tensor": _torch(n, tensors, repeats, foreach=False),
        }
        fused = rows["torch AdamW fused=True"]
        for method, t in rows.items():
            report.rows.append(
                {
                    "params": n,
                    "method": method,
                    "step_ms": t * 1e3,
                    "Mparams_per_s": n / t / 1e6,
                    "vs_torch_fused": fused / t,
                    "bandwidth_fraction": (n * BYTES_PER_PARAM / t) / bw,
                }
            )
    largest = [r for r in report.rows if r["params"] == sizes[-1]]
    ours = largest[0]
    report.summary = {
        "memory bandwidth (GB/s)": bw / 1e9,
        "hybrid Adam Mparams/s (largest size)": ours["Mparams_per_s"],
        "hybrid / torch fused speed": ours["vs_torch_fused"],
        "hybrid / torch foreach speed": largest[2]["step_ms"] / ours["step_ms"],
        "fraction of the measured-bandwidth bound (~1: memory bound)": ours["bandwidth_fraction"],
        "threads": torch.get_num_threads(),
    }
    report.notes = [
        f"An fp32 Adam step must move {BYTES_PER_PARAM} bytes per parameter (read p, g, m, v; "
        "write p, m, v); bandwidth_fraction = that traffic per second / the memory bandwidth "
        "measured in the same run (the faster of a copy and a triad over 128 MiB arrays, "
        "write-allocate reads counted). "
        "Sizes whose four fp32 arrays fit in the caches can exceed 1.",
        f"The hybrid update runs on one flat shard cut into {tensors} parameter slices (as a "
        "Gemini chunk shard is), one fused kernel call per device; torch's optimizers get "
        f"{tensors} separate parameters of the same total size.",
        "Medians of the step times. The machine is shared (2 cores); figures move with its load.",
    ]
    return report
