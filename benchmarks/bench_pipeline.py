"""Pipeline schedules measured: idle fraction per stage, peak activation bytes, p2p bytes.

1. Idle fraction. Every stage's forward sleeps ``t_f`` and its backward ``2 t_f`` (an autograd
   function around a real parameter), so the measured timeline is the schedule's and the
   runtime's (p2p on gloo, bookkeeping), not the two shared cores' contention. Per rank, from
   ``run_pipeline``'s per-micro-batch timestamps: ``1 - busy / span`` over the step, against
   ``(p-1)/(m+p-1)`` (GPipe, 1F1B) and ``((p-1)/v)/(m+(p-1)/v)`` (interleaved). A few rows run a
   real GPT on p = 2 (two ranks on two cores) for comparison.
2. Peak activation bytes per stage: a GPT split in 4 stages, one step of GPipe and of 1F1B at
   m = 4, 8, 16 under colossal-memtrace's live-tensor tracker (peak live bytes during the step
   minus those alive before it: activations, received buffers, gradients).
3. Point-to-point bytes counted on every rank against ``m * a * (stages that send forward +
   stages that send backward)`` plus the tied embedding's gradient on the first and last rank.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

import colossal_parallel as cp
from colossal_contracts import TierName
from colossal_memtrace import LiveTensorTracker
from colossal_models import GPT, GPTConfig, split_into_stages
from colossal_testing import World

from _report import Report

WIDTH = 64  # features of the sleeping stages' activation
STEPS = 3  # measured steps per configuration (after one warm-up); the median one is reported


class _Sleep(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, t_f: float, t_b: float):
        time.sleep(t_f)
        ctx.t_b = t_b
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        time.sleep(ctx.t_b)
        return g, None, None


class SleepStage(nn.Module):
    """A stage whose forward takes ``t_f`` seconds and backward ``t_b``."""

    def __init__(self, t_f: float, t_b: float, last: bool):
        super().__init__()
        self.w = nn.Parameter(torch.ones(WIDTH))
        self.t_f, self.t_b, self.last = t_f, t_b, last

    def forward(self, x, targets=None):
        y = _Sleep.apply(x * self.w, self.t_f, self.t_b)
        return (y - targets).pow(2).mean() if self.last else y


def _schedule(kind: str, m: int) -> cp.pipeline.PipelineSchedule:
    return cp.pipeline.PipelineSchedule(kind, m, 2 if kind == "interleaved" else 1)


def measure_idle(kind: str, m: int, t_f: float, steps: int) -> list:
    """Rank-side: the timeline of the last of ``steps`` steps, times relative to its start."""
    p = dist.get_world_size()
    mesh = cp.ProcessMesh(cp.MeshConfig(pp=p))
    sched = _schedule(kind, m)
    v = sched.num_virtual
    chunks = [
        SleepStage(t_f, 2 * t_f, last=(c * p + mesh.coord("pp") == p * v - 1)) for c in range(v)
    ]
    x = torch.randn(2 * m, WIDTH)
    out = []
    for step in range(steps + 1):  # step 0 warms up
        dist.barrier()
        t0 = time.perf_counter()
        res = cp.pipeline.run_pipeline(chunks, mesh, sched, x, x, boundary_shape=(2, WIDTH))
        if step:
            out.append(
                [(a.kind, a.microbatch, a.chunk, s - t0, e - t0) for a, s, e in res.timeline]
            )
    mesh.close()
    return out


GPT_CFG = GPTConfig(vocab_size=256, max_seq_len=64, num_layers=8, num_heads=4, hidden_size=128)


def measure_gpt(kind: str, m: int, mb: int, seq: int, steps: int, trace: bool) -> dict:
    """Rank-side: a GPT pipeline's timeline, peak live bytes of one step, counted p2p bytes."""
    p = dist.get_world_size()
    mesh = cp.ProcessMesh(cp.MeshConfig(pp=p))
    sched = _schedule(kind, m)
    torch.manual_seed(0)
    stages = split_into_stages(GPT(GPT_CFG), mesh, num_virtual=sched.num_virtual)
    g = torch.Generator().manual_seed(1)
    data = torch.randint(0, 256, (m * mb, seq + 1), generator=g)
    x, y = data[:, :-1], data[:, 1:]
    shape = stages.boundary_shape(mb, seq)

    def step():
        for q in stages.parameters():
            q.grad = None
        return cp.pipeline.run_pipeline(
            stages.chunks, mesh, sched, x, y, boundary_shape=shape, tied=stages.tied
        )

    step()  # warm-up
    timelines = []
    for _ in range(steps):
        mesh.comm.counter.reset()
        dist.barrier()
        t0 = time.perf_counter()
        res = step()
        timelines.append(
            [(a.kind, a.microbatch, a.chunk, s - t0, e - t0) for a, s, e in res.timeline]
        )
    sends = mesh.comm.counter.bytes("pp", "send")
    peak = None
    if trace:
        for q in stages.parameters():
            q.grad = None
        with LiveTensorTracker("cpu") as tr:
            tr.track(stages.parameters(), model=True)
            tr.track([x, y])
            base = tr.used_bytes(TierName.ACCELERATOR)
            step()
            peak = tr.peak_bytes(TierName.ACCELERATOR) - base
        tr.close()
    me, v = mesh.coord("pp"), sched.num_virtual
    mine = [c * p + me for c in range(v)]
    act = mb * seq * GPT_CFG.hidden_size * 4
    n_send = sum(s != p * v - 1 for s in mine) + sum(s != 0 for s in mine)
    tied = GPT_CFG.vocab_size * GPT_CFG.hidden_size * 4 if p > 1 and me in (0, p - 1) else 0
    mesh.close()
    return {
        "timelines": timelines,
        "peak": peak,
        "sends": sends,
        "formula": m * act * n_send + tied,
    }


def _idle(timelines: list) -> list[float]:
    t0 = min(ev[3] for tl in timelines for ev in tl)
    t1 = max(ev[4] for tl in timelines for ev in tl)
    return [1 - sum(e - s for *_, s, e in tl) / (t1 - t0) for tl in timelines]


def _median_step(per_rank: list) -> list:
    """Of several measured steps (per rank, a list of timelines), the step with the median mean
    idle fraction: one descheduled process on the loaded machine does not decide a row."""
    steps = [[tls[i] for tls in per_rank] for i in range(len(per_rank[0]))]
    steps.sort(key=lambda st: sum(_idle(st)))
    return steps[len(steps) // 2]


def _hop_delay_ms(timelines: list, p: int) -> float:
    """Median time an action started after both its input's producer and its rank's previous
    action had ended: the per-message cost of the runtime and gloo, which the formula omits."""
    v = 1 + max(ev[2] for tl in timelines for ev in tl)
    last = p * v - 1
    end = {(k, mbi, c * p + r): e for r, tl in enumerate(timelines) for k, mbi, c, _, e in tl}
    delays = []
    for r, tl in enumerate(timelines):
        prev = None
        for k, mbi, c, s, e in tl:
            stage = c * p + r
            if k == "F":
                dep = ("F", mbi, stage - 1) if stage > 0 else None
            else:
                dep = ("B", mbi, stage + 1) if stage < last else None
            if dep is not None:
                ready = max(end[dep], prev if prev is not None else end[dep])
                delays.append(s - ready)
            prev = e
    delays.sort()
    return 1e3 * delays[len(delays) // 2] if delays else 0.0


def _plot(timelines: dict, p: int, m: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(timelines), 1, figsize=(11, 1.0 + 0.75 * p * len(timelines)))
    for ax, (kind, tls) in zip(axes, timelines.items()):
        t0 = min(ev[3] for tl in tls for ev in tl)
        for r, tl in enumerate(tls):
            for k, mbi, c, s, e in tl:
                shade = ("#7fb3e0", "#2d6ca8") if k == "F" else ("#f4b183", "#c55a11")
                ax.barh(
                    r, (e - s) * 1e3, left=(s - t0) * 1e3, color=shade[c % 2], edgecolor="k", lw=0.4
                )
                ax.text(
                    (s - t0 + (e - s) / 2) * 1e3, r, str(mbi), ha="center", va="center", fontsize=6
                )
        ax.set_yticks(range(p), [f"rank {r}" for r in range(p)])
        ax.invert_yaxis()
        fr = sum(_idle(tls)) / p
        ax.set_title(f"{kind}: p={p}, m={m}, measured idle {fr:.3f}", fontsize=9)
        ax.set_xlabel("ms (blue forward, orange backward; dark = second chunk)", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(quick: bool, out_dir: Path) -> Report:
    t_f = 0.005 if quick else 0.05
    ms = [4, 8] if quick else [4, 8, 16]
    kinds = ["gpipe", "1f1b", "interleaved"]
    rows, pictures = [], {}
    for p in (2, 4):
        with World(p) as world:
            for m in ms:
                for kind in kinds:
                    tls = _median_step(world.run(measure_idle, kind, m, t_f, STEPS))
                    v = 2 if kind == "interleaved" else 1
                    idle = _idle(tls)
                    want = cp.pipeline.ideal_idle_fraction(kind, p, m, v)
                    rows.append(
                        {
                            "part": "idle",
                            "stages": "sleep",
                            "schedule": kind,
                            "p": p,
                            "m": m,
                            "v": v,
                            "measured idle (mean)": sum(idle) / p,
                            "measured idle (max)": max(idle),
                            "formula": want,
                            "measured / formula": (sum(idle) / p) / want,
                            "hop delay ms": _hop_delay_ms(tls, p),
                        }
                    )
                    if p == 4 and m == 8:
                        pictures[kind if v == 1 else "interleaved (v=2)"] = tls
            if p == 2:
                for m in ms[:2]:
                    for kind in ("1f1b", "interleaved"):
                        res = world.run(measure_gpt, kind, m, 2, 64, STEPS, False)
                        tls = _median_step([r["timelines"] for r in res])
                        idle = _idle(tls)
                        v = 2 if kind == "interleaved" else 1
                        want = cp.pipeline.ideal_idle_fraction(kind, p, m, v)
                        rows.append(
                            {
                                "part": "idle",
                                "stages": "GPT",
                                "schedule": kind,
                                "p": p,
                                "m": m,
                                "v": v,
                                "measured idle (mean)": sum(idle) / p,
                                "measured idle (max)": max(idle),
                                "formula": want,
                                "measured / formula": (sum(idle) / p) / want,
                                "hop delay ms": _hop_delay_ms(tls, p),
                            }
                        )
            else:
                peaks: dict = {}
                for m in [4, 8] if quick else [4, 8, 16]:
                    for kind in ("gpipe", "1f1b"):
                        res = world.run(measure_gpt, kind, m, 2, 64, 1, True)
                        for r, x in enumerate(res):
                            peaks[(kind, m, r)] = x["peak"]
                            rows.append(
                                {
                                    "part": "memory+p2p",
                                    "stages": "GPT",
                                    "schedule": kind,
                                    "p": p,
                                    "m": m,
                                    "v": 1,
                                    "rank": r,
                                    "peak MiB": x["peak"] / 2**20,
                                    "alive (schedule)": m if kind == "gpipe" else min(p - r, m),
                                    "p2p sent B": x["sends"],
                                    "p2p formula B": x["formula"],
                                    "p2p match": x["sends"] == x["formula"],
                                }
                            )
                for row in rows:
                    if row["part"] == "memory+p2p":
                        row["peak / 1F1B"] = (
                            peaks[(row["schedule"], row["m"], row["rank"])]
                            / peaks[("1f1b", row["m"], row["rank"])]
                        )
    _plot(pictures, 4, 8, out_dir / "pipeline_timeline.png")
    idle_rows = [r for r in rows if r["part"] == "idle" and r["stages"] == "sleep"]
    mem = [r for r in rows if r["part"] == "memory+p2p"]
    m_hi = max(r["m"] for r in mem)
    summary = {
        "idle measured/formula, sleep stages (min..max)": f"{min(r['measured / formula'] for r in idle_rows):.3f}..{max(r['measured / formula'] for r in idle_rows):.3f}",
        "every p2p count equals its formula": all(r["p2p match"] for r in mem),
        **{
            f"rank {r['rank']} peak GPipe/1F1B at m={m_hi}": r["peak / 1F1B"]
            for r in mem
            if r["schedule"] == "gpipe" and r["m"] == m_hi
        },
        "rank 0 GPipe peak growth m=4 -> max m": next(
            r["peak MiB"]
            for r in mem
            if r["schedule"] == "gpipe" and r["m"] == m_hi and r["rank"] == 0
        )
        / next(
            r["peak MiB"]
            for r in mem
            if r["schedule"] == "gpipe" and r["m"] == 4 and r["rank"] == 0
        ),
        "rank 0 1F1B peak growth m=4 -> max m": next(
            r["peak MiB"]
            for r in mem
            if r["schedule"] == "1f1b" and r["m"] == m_hi and r["rank"] == 0
        )
        / next(
            r["peak MiB"] for r in mem if r["schedule"] == "1f1b" and r["m"] == 4 and r["rank"] == 0
        ),
    }
    return Report(
        name="pipeline",
        title="Pipeline schedules: measured idle fraction vs the bubble formula, peak activation bytes, p2p bytes",
        columns=[
            "part",
            "stages",
            "schedule",
            "p",
            "m",
            "v",
            "measured idle (mean)",
            "measured idle (max)",
            "formula",
            "measured / formula",
            "hop delay ms",
            "rank",
            "peak MiB",
            "alive (schedule)",
            "peak / 1F1B",
            "p2p sent B",
            "p2p formula B",
            "p2p match",
        ],
        rows=rows,
        summary=summary,
        notes=[
            f"Idle rows, stages 'sleep': forward sleeps {t_f * 1e3:.0f} ms and backward "
            f"{2 * t_f * 1e3:.0f} ms per micro-batch and chunk (the idle fraction does not "
            "depend on the unit, so interleaved chunks sleep as long as whole stages); the "
            "step with the median idle of 3 (after a warm-up) is reported. Idle = 1 - busy / "
            "span, span from the first action start to the last action end on any rank; "
            "busy excludes waiting for a message.",
            "Idle rows, stages 'GPT': a real 8-block GPT (hidden 128, micro-batch 2 x 64 tokens) "
            "on 2 ranks; backward is not exactly twice forward and stages are not equal (the "
            "last holds the head and loss), so the formula is only a guide there.",
            "The machine was shared with other jobs (2 cores, loaded): sleeps "
            "overshoot and every message costs the runtime and gloo some milliseconds ('hop "
            "delay ms': median time an action started after its input was produced and its "
            "rank was free). The formula assumes free messages, so measured idle exceeds it "
            "by about (hops on the critical path x hop delay) / span; the excess shrinks as "
            "compute per action grows (quick run 5 ms, full run 50 ms forward).",
            "Memory rows: p = 4 stages of 2 blocks, micro-batch 2 x 64 tokens; peak live bytes "
            "of one step above what was alive before it (colossal-memtrace LiveTensorTracker, "
            "CPU emulating the accelerator), so parameter gradients (the same for both "
            "schedules) are included. 'alive (schedule)' is the most micro-batches whose "
            "activations a rank holds at once by the schedule: m for GPipe, p - rank for 1F1B.",
            "p2p: counted bytes sent on the pp axis in one step; formula m * (2 x 64 x 128 x 4 B) "
            "per stage boundary crossed forward and backward, plus the tied embedding's "
            "gradient (256 x 128 x 4 B) swapped between the first and last rank.",
        ],
        figures=["pipeline_timeline.png"],
    )
