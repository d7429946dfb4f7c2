"""Longest sequence GPT-tiny trains under a fixed per-rank activation budget: sp = 1 against
ring attention and Ulysses at sp = 2 and 4, with their counted bytes against the formulas.

Per rank, the figure is the peak of live bytes during one forward and backward above what was
alive before it (colossal-memtrace's live-tensor tracker, the CPU emulating the accelerator):
activations, attention temporaries, blocks in flight and parameter gradients; the gradient
all-reduce over ``sp`` that follows is outside it. The longest length is searched in steps of 64
tokens: an affine fit of the peak from two short lengths predicts it, then real steps at the
prediction, widened and bisected, confirm the longest length that fits and the next that does
not.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
import torch.distributed as dist

import colossal_parallel as cp
from colossal_contracts import TierName
from colossal_memtrace import LiveTensorTracker
from colossal_models import GPT, GPTConfig, apply_sequence_parallel
from colossal_testing import World

from _report import Report

UNIT = 64  # sequence lengths searched (a multiple of 2 * sp for the zigzag layout)
B = 1


def _cfg(seq_len: int) -> GPTConfig:
    return GPTConfig.preset("tiny", max_seq_len=seq_len)


def measure(method: str, seq_len: int) -> dict:
    """Rank-side: peak live bytes of one forward + backward, counted sp bytes, seconds."""
    sp = dist.get_world_size()
    cfg = _cfg(seq_len)
    torch.manual_seed(0)
    model = GPT(cfg)
    mesh = None
    if method != "none":
        mesh = cp.ProcessMesh(cp.MeshConfig(sp=sp))
        apply_sequence_parallel(model, mesh, method)
    g = torch.Generator().manual_seed(1)
    data = torch.randint(0, 256, (B, seq_len + 1), generator=g)
    x, y = data[:, :-1], data[:, 1:]
    t = time.perf_counter()
    with LiveTensorTracker("cpu") as tr:
        tr.track(model.parameters(), model=True)
        tr.track([x, y])
        base = tr.used_bytes(TierName.ACCELERATOR)
        model(x, y).backward()
        peak = tr.peak_bytes(TierName.ACCELERATOR) - base
    tr.close()
    seconds = time.perf_counter() - t
    out = {"peak": peak, "seconds": seconds, "counted": 0, "formula": 0}
    if mesh is not None:
        counter = mesh.comm.counter
        h, d, n = cfg.num_heads, cfg.head_dim, cfg.num_layers
        if method == "ring":
            out["counted"] = counter.bytes("sp", "send")
            out["formula"] = n * sum(cp.sequence.ring_attention_comm_bytes(B, h, seq_len, d, sp))
        else:
            out["counted"] = counter.bytes("sp", "all_to_all")
            out["formula"] = n * sum(cp.sequence.ulysses_comm_bytes(B, h, seq_len, d, sp))
        cp.all_reduce_grads(model.parameters(), mesh.comm, "sp", average=False)
        mesh.close()
    return out


def _longest(world: World, method: str, budget: int, hi: int) -> tuple[int, dict, int, int]:
    """(longest fitting length, its measurement, measurements taken, shortest length over)."""
    sp = world.world_size
    runs = 0
    seen: dict[int, dict] = {}

    def peak_at(n: int) -> dict:
        nonlocal runs
        if n not in seen:
            runs += 1
            res = world.run(measure, method, n)
            worst = max(res, key=lambda r: r["peak"])
            seen[n] = {**worst, "counted_all_equal": len({r["counted"] for r in res}) == 1}
        return seen[n]

    a, b = 2 * sp * UNIT, 4 * sp * UNIT
    pa, pb = peak_at(a)["peak"], peak_at(b)["peak"]
    guess = int((budget - pa) / ((pb - pa) / (b - a)) + a) // UNIT * UNIT
    n = max(UNIT, min(guess, hi))
    # bracket [fits, over] around the guess, then bisect on multiples of UNIT
    step = UNIT
    if peak_at(n)["peak"] <= budget:
        lo, up = n, n + step
        while up <= hi and peak_at(up)["peak"] <= budget:
            lo, step = up, 2 * step
            up = lo + step
        up = min(up, hi + UNIT)
    else:
        up, lo = n, n - step
        while lo > 0 and peak_at(lo)["peak"] > budget:
            up, step = lo, 2 * step
            lo = max(0, up - step)
    while up - lo > UNIT:
        mid = (lo + up) // 2 // UNIT * UNIT
        if peak_at(mid)["peak"] <= budget:
            lo = mid
        else:
            up = mid
    return lo, (seen[lo] if lo else peak_at(UNIT)), runs, up


def run(quick: bool, out_dir: Path) -> Report:
    budget = (32 if quick else 64) * 2**20
    hi = 64 * UNIT
    plan = [(1, "none"), (2, "ring"), (2, "ulysses"), (4, "ring"), (4, "ulysses")]
    rows, base = [], None
    for sp in (1, 2, 4):
        with World(sp) as world:
            for size, method in plan:
                if size != sp:
                    continue
                n, res, runs, over = _longest(world, method, budget, hi)
                base = n if sp == 1 else base
                rows.append(
                    {
                        "sp": sp,
                        "attention": "full (SDPA)" if method == "none" else method,
                        "longest T": n,
                        "T / T(sp=1)": n / base if base else float("nan"),
                        "peak MiB at T": res["peak"] / 2**20,
                        "next T over budget": over,
                        "step s at T": res["seconds"],
                        "counted sp MiB": res["counted"] / 2**20,
                        "formula MiB": res["formula"] / 2**20,
                        "match": res["counted"] == res["formula"] and res["counted_all_equal"],
                        "steps measured": runs,
                    }
                )
    par = [r for r in rows if r["sp"] > 1]
    summary = {
        "budget MiB per rank": budget / 2**20,
        "sp=1 longest T": base,
        **{f"{r['attention']} sp={r['sp']}: T / T(sp=1)": r["T / T(sp=1)"] for r in par},
        "every counted byte figure equals its formula": all(r["match"] for r in par),
    }
    return Report(
        name="long_seq",
        title="Long sequences: longest GPT-tiny sequence under a per-rank activation budget, sp=1 vs ring attention and Ulysses",
        columns=list(rows[0].keys()),
        rows=rows,
        summary=summary,
        notes=[
            f"GPT-tiny (4 blocks, hidden 256, 4 heads, byte vocabulary) with its position table "
            f"lengthened to each T, batch {B}, fp32, one forward + backward per measurement; "
            f"budget {budget / 2**20:.0f} MiB of live bytes per rank above the parameters.",
            "sp = 1 runs torch's scaled_dot_product_attention (CPU flash kernel: memory linear "
            "in T). Ring attention uses the zigzag layout and 256-token tiles; Ulysses the "
            "contiguous layout with 4/sp heads per rank after the all-to-all.",
            "Counted bytes per rank and step: ring = key/value blocks sent (forward sp-1 blocks, "
            "backward sp-1 blocks and sp gradient blocks of 2 B H (T/sp) D fp32 each, per "
            "layer); Ulysses = all-to-all inputs (4 B H (T/sp) D per pass per layer).",
            "The parameter gradients (about 13 MiB for GPT-tiny, plus the lengthened position "
            "table's) are inside every rank's budget whatever sp is, which is why T / T(sp=1) "
            "stays below sp; the per-token activation bytes divide by sp.",
            "Step times are on a shared, loaded 2-core machine with sp processes; they are "
            "shown for orientation, not as a speed comparison.",
        ],
    )
