"""A chunk's collectives on gloo: which algorithm colossal-chunk picks, measured side by side.

Reduce-scatter: gloo's own ``reduce_scatter`` against colossal-chunk's all-to-all and local sum
(``launch_reduce_scatter(all_to_all=True)``, [Note: reduce-scatter on gloo]); all-gather:
gloo's own against the same all-to-all (every rank sends its shard to every rank), which
colossal-chunk does not use, to show it would not help. Chunk-sized fp32 buffers (1, 3 and 16
MiB: a tight budget's chunks up to a no-budget mini's), on 2 and 4 ranks of this host; every
repetition runs each method once, in a rotated order, between barriers.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

from colossal_chunk._chunk import _all_gather
from colossal_chunk._reduce_scatter import _native, launch_reduce_scatter
from colossal_testing import World

from _report import Report

MIB = 2**20


def _methods(numel: int) -> dict:
    ws, rank = dist.get_world_size(), dist.get_rank()
    g = torch.Generator().manual_seed(rank)
    full, out = torch.randn(numel, generator=g), torch.empty(numel // ws)
    shard, gathered = torch.randn(numel // ws, generator=g), torch.empty(numel)
    received = torch.empty(numel)

    def ag_a2a() -> None:
        send = shard.repeat(ws)  # the all-to-all's input: the shard once per destination
        dist.all_to_all_single(received, send, async_op=True).wait()

    return {
        "reduce-scatter: gloo": lambda: _native(out, full, async_op=True).wait(),
        "reduce-scatter: all-to-all + sum": lambda: launch_reduce_scatter(
            out, full, None, all_to_all=True
        ).wait(),
        "all-gather: gloo": lambda: _all_gather(gathered, shard, async_op=True).wait(),
        "all-gather: all-to-all": ag_a2a,
    }


def measure(sizes: list[int], reps: int) -> list[dict]:
    """Rank-side: median and IQR milliseconds of each method at each size (rank 0's clock)."""
    rows = []
    for nbytes in sizes:
        methods = _methods(nbytes // 4)
        times: dict[str, list[float]] = {k: [] for k in methods}
        names = list(methods)
        for i in range(reps + 2):
            k = i % len(names)
            for name in names[k:] + names[:k]:
                dist.barrier()
                t0 = time.perf_counter()
                methods[name]()
                if i >= 2:
                    times[name].append(time.perf_counter() - t0)
        for name, ts in times.items():
            q = statistics.quantiles(ts, n=4)
            rows.append(
                {
                    "MiB": nbytes // MIB,
                    "method": name,
                    "median ms": round(statistics.median(ts) * 1e3, 2),
                    "IQR ms": f"{q[0] * 1e3:.2f}-{q[2] * 1e3:.2f}",
                }
            )
    return rows


def run(quick: bool, out_dir: Path) -> Report:
    sizes = [MIB, 3 * MIB] if quick else [MIB, 3 * MIB, 16 * MIB]
    reps = 8 if quick else 30
    rows, summary = [], {}
    for n in (2, 4):
        with World(n) as w:
            got = w.run(measure, sizes, reps)[0]
        by = {}
        for r in got:
            rows.append({"ranks": n, **r})
            by[(r["MiB"], r["method"])] = r["median ms"]
        for mib in sorted({m for m, _ in by}):
            rs = by[(mib, "reduce-scatter: gloo")] / by[(mib, "reduce-scatter: all-to-all + sum")]
            ag = by[(mib, "all-gather: gloo")] / by[(mib, "all-gather: all-to-all")]
            summary[f"{n} ranks, {mib} MiB: gloo's reduce-scatter / all-to-all + sum"] = round(
                rs, 2
            )
            summary[f"{n} ranks, {mib} MiB: gloo's all-gather / all-to-all"] = round(ag, 2)
    rs_ratios = [v for k, v in summary.items() if "reduce-scatter" in k]
    summary["all-to-all + sum faster than gloo's reduce-scatter everywhere"] = all(
        v > 1.0 for v in rs_ratios
    )
    notes = [
        "fp32 buffers of 1, 3 and 16 MiB (a gathered chunk; a rank's slice is 1/ranks of it); "
        "torch's gloo backend over loopback, every rank a process on this host's "
        f"{os.cpu_count()} cores (4 ranks share them).",
        "Each repetition runs every method once in a rotated order, each between barriers; "
        "2 repetitions dropped, then median and inter-quartile range of rank 0's clock.",
        "'all-to-all + sum': colossal-chunk's reduce-scatter on gloo (one all_to_all_single "
        "of the buffer, then a sum over ranks of the received slices into this rank's slice). "
        "'all-gather: all-to-all': the shard repeated once per rank and all-to-all'd, for "
        "comparison only; colossal-chunk gathers with gloo's all-gather.",
    ]
    return Report(
        name="collectives",
        title="Chunk collectives on gloo: gloo's own vs an all-to-all, 2 and 4 ranks",
        columns=["ranks", "MiB", "method", "median ms", "IQR ms"],
        rows=rows,
        summary=summary,
        notes=notes,
    )
