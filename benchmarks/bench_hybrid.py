"""Tokens/s and counted bytes per mesh axis of every layout of 4 ranks, side by side.

One 4-rank gloo world trains GPT-mini's shape (fp32, 8 blocks so that 4 interleaved stages of 2
chunks each fit) through the Booster in each layout of ``LAYOUTS``: data parallelism with ZeRO 0, 1
and 2, 1D tensor parallelism with and without Megatron sequence parallelism, 2D tensor
parallelism, pipelines (1F1B, interleaved), tp x pp, ring sequence parallelism (with ZeRO-2, with
pp, with Megatron's over tp2), Ulysses with tp, and Gemini (with tp2, and with ring sp2).
Layouts take turns in blocks of ``steps`` steps, round robin, so the machine's load drift hits
all of them alike; each block builds
its layout from the same seed, trains one warmup step plus ``steps`` timed ones on the same global
batches, and frees it (one layout's memory at a time). Every layout trains the same model on the
same data, so the last loss of every block must agree (the column ``loss - dp4``): a layout that
ran fast by computing something else would show there.

Bytes are the mesh's counted collective payloads per rank and step (``booster.memory_stats()``,
``comm_<axis>_bytes_total``), averaged over the 4 ranks: exact, and the same on GPUs with NCCL;
each axis is set beside its analytic count (``_hybrid_bytes.formula_bytes``), and the summary
says on how many (layout, axis) pairs the two are equal to the byte. Times are not exact: see
the notes.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from _hybrid_bytes import formula_bytes

from colossal import Booster, GeminiPlugin, HybridParallelPlugin
from colossal_models import GPT, GPTConfig
from colossal_testing import World

from _report import Report, load_note

WORLD = 4
AXES = ("dp", "tp", "pp", "sp")

# name -> (plugin, settings); pp layouts split the batch into 4 micro-batches
LAYOUTS: dict[str, tuple[str, dict[str, Any]]] = {
    "dp4 zero0": ("hybrid", {}),
    "dp4 zero1": ("hybrid", {"zero_stage": 1}),
    "dp4 zero2": ("hybrid", {"zero_stage": 2}),
    "tp2(1d) x dp2": ("hybrid", {"tp_size": 2}),
    "tp2(1d)+megatron sp x dp2": ("hybrid", {"tp_size": 2, "sequence_parallel": "megatron"}),
    "tp4(2d)": ("hybrid", {"tp_size": 4, "tp_mode": "2d"}),
    "pp2(1f1b) x dp2": ("hybrid", {"pp_size": 2, "microbatches": 4}),
    "tp2 x pp2(1f1b)": ("hybrid", {"tp_size": 2, "pp_size": 2, "microbatches": 4}),
    "pp4(interleaved, 2 chunks)": (
        "hybrid",
        {"pp_size": 4, "microbatches": 4, "schedule": "interleaved"},
    ),
    "ring sp2 x dp2": ("hybrid", {"sequence_parallel": "ring", "sp_size": 2}),
    "ring sp2 x dp2 zero2": (
        "hybrid",
        {"sequence_parallel": "ring", "sp_size": 2, "zero_stage": 2},
    ),
    "ulysses sp2 x tp2": ("hybrid", {"sequence_parallel": "ulysses", "sp_size": 2, "tp_size": 2}),
    "ring sp2 x tp2+megatron sp": (
        "hybrid",
        {"sequence_parallel": "ring+megatron", "sp_size": 2, "tp_size": 2},
    ),
    "ring sp2 x pp2(1f1b)": (
        "hybrid",
        {"sequence_parallel": "ring", "sp_size": 2, "pp_size": 2, "microbatches": 4},
    ),
    "tp2 x pp2(1f1b) zero1": (
        "hybrid",
        {"tp_size": 2, "pp_size": 2, "microbatches": 4, "zero_stage": 1},
    ),
    "gemini dp4": ("gemini", {}),
    "gemini tp2 x dp2": ("gemini", {"tp_size": 2}),
    "gemini ring sp2 x dp2": ("gemini", {"sequence_parallel": "ring", "sp_size": 2}),
}
BASE = "dp4 zero0"


def _layouts() -> dict[str, tuple[str, dict[str, Any]]]:
    """``LAYOUTS`` less Gemini with tp where this GeminiPlugin has no ``tp_size``."""
    has_tp = "tp_size" in GeminiPlugin.__dataclass_fields__
    return {k: v for k, v in LAYOUTS.items() if has_tp or not (v[0] == "gemini" and v[1])}


def _config(quick: bool) -> GPTConfig:
    if quick:
        return GPTConfig(vocab_size=256, max_seq_len=64, num_layers=8, num_heads=4, hidden_size=64)
    return GPTConfig.preset("mini", num_layers=8)


def _block(
    cfg: GPTConfig, plugin_name: str, settings: dict, batches: list, steps: int
) -> dict[str, Any]:
    """Rank-side: one layout, built from seed 0, one warmup step and ``steps`` timed ones."""
    plugin = (HybridParallelPlugin if plugin_name == "hybrid" else GeminiPlugin)(**settings)
    torch.manual_seed(0)
    model = GPT(cfg)
    booster = Booster(plugin)
    model, opt = booster.boost(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    mesh = getattr(plugin, "mesh", None)  # None: Gemini over every rank
    if mesh is not None:
        coord, dp = mesh.coord("dp"), mesh.size("dp")
    else:
        coord, dp = dist.get_rank(), dist.get_world_size()
    b = batches[0][0].shape[0]
    rows = slice(coord * b // dp, (coord + 1) * b // dp)

    def step(x: torch.Tensor, y: torch.Tensor) -> float:
        loss = booster.execute_pipeline(x[rows], y[rows], model, opt)
        opt.step()
        opt.zero_grad(set_to_none=True)
        t = loss.detach().float().reshape(1)
        if dp > 1:  # the ranks of one dp coordinate hold the same micro-batch's loss
            dist.all_reduce(t, group=mesh.group("dp") if mesh is not None else None)
        return float(t) / dp

    step(*batches[0])  # warmup: Gemini traces, buffers allocate
    before = booster.memory_stats()
    ops0 = mesh.comm.counter.snapshot() if mesh is not None else {}
    dist.barrier()
    t0 = time.perf_counter()
    loss = float("nan")
    for x, y in batches[1 : steps + 1]:
        loss = step(x, y)
    dist.barrier()
    elapsed = time.perf_counter() - t0
    after = booster.memory_stats()
    ops1 = mesh.comm.counter.snapshot() if mesh is not None else {}
    ops = {  # counted bytes per step by (axis, op): what the per-axis totals are made of
        f"{a}/{o}": (st.bytes - (ops0[(a, o)].bytes if (a, o) in ops0 else 0)) / steps
        for (a, o), st in ops1.items()
    }
    counted = {
        a: (after.get(f"comm_{a}_bytes_total", 0) - before.get(f"comm_{a}_bytes_total", 0)) / steps
        for a in AXES
    }
    counted_axes = [a for a in AXES if f"comm_{a}_bytes_total" in after]
    mesh_line = after.get("mesh", "")
    close = getattr(plugin, "close", None)
    if close is not None:
        close()
    return {
        "elapsed": elapsed,
        "bytes": counted,
        "counted_axes": counted_axes,
        "ops": ops,
        "num_local_params": sum(p.numel() for p in model.parameters()),
        "loss": loss,
        "mesh": mesh_line,
    }


def measure(
    quick: bool,
    rounds: int,
    steps: int,
    batch: int,
    seq: int,
    *,
    names: list[str] | None = None,
    cfg: GPTConfig | None = None,
) -> dict[str, Any]:
    """Rank-side: every layout (or those ``names``), round robin by blocks of ``steps`` steps."""
    cfg = cfg or _config(quick)
    g = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(steps + 1):
        d = torch.randint(0, cfg.vocab_size, (batch, seq + 1), generator=g)
        batches.append((d[:, :-1], d[:, 1:]))
    layouts = {k: v for k, v in _layouts().items() if names is None or k in names}
    out: dict[str, Any] = {name: [] for name in layouts}
    for _ in range(rounds):
        for name, (plugin, settings) in layouts.items():
            out[name].append(_block(cfg, plugin, settings, batches, steps))
    return {"results": out, "num_params": cfg.num_params()}


def _gemini_dp_note(names: list[str]) -> str:
    return (
        "Gemini's own data-parallel collectives (chunk all-gathers and gradient reduce-scatters "
        "over dp) are not counted by the mesh, so its dp column is empty"
        + (" (the tp column of gemini tp2 x dp2 is counted)." if len(names) > 1 else ".")
    )


def _versus(counted: float, formula: float | None, steps: int) -> tuple[str, bool]:
    """The formula column's cell and whether the counted mean equals the formula to the byte
    (over all ranks and timed steps, where both are whole numbers of bytes)."""
    if formula is None:
        return "no formula", False
    if abs(counted - formula) * WORLD * steps < 0.5:
        return "equal", True
    return f"{formula / 2**20:.6g} ({counted - formula:+.0f} B)", False


def run(quick: bool, out_dir: Path) -> Report:
    rounds, steps, batch, seq = (1, 2, 8, 32) if quick else (2, 2, 8, 128)
    load_before = os.getloadavg()[0]
    with World(WORLD, timeout_s=3600) as world:
        per_rank = world.run(measure, quick, rounds, steps, batch, seq)
    names = list(per_rank[0]["results"])
    tokens = batch * seq  # global tokens per step, every layout
    rows = []
    pairs: list[bool] = []  # per (layout, counted axis): counted bytes == formula
    cfg = _config(quick)
    base_tps = None
    base_loss = per_rank[0]["results"][BASE][-1]["loss"]
    for name in names:
        blocks = [r["results"][name] for r in per_rank]  # [rank][round]
        gem = name.startswith("gemini")  # its dp collectives are not the mesh's
        elapsed = sum(max(b[i]["elapsed"] for b in blocks) for i in range(rounds))
        tps = tokens * steps * rounds / elapsed
        base_tps = tps if name == BASE else base_tps
        axes = [a for a in blocks[0][0]["counted_axes"] if not (gem and a == "dp")]
        row: dict[str, Any] = {
            "layout": name,
            "mesh": blocks[0][0]["mesh"] or name,
            "tokens/s": tps,
        }
        plugin, settings = LAYOUTS[name]
        formula = formula_bytes(cfg, plugin, settings, world=WORLD, batch=batch, seq=seq)
        for a in AXES:
            if a in axes:
                mean = sum(b[-1]["bytes"][a] for b in blocks) / WORLD
                row[f"{a} MiB/step"] = mean / 2**20
                row[f"{a} formula"], same = _versus(mean, formula.get(a), steps)
                pairs.append(same)
                row[f"_{a} bytes"] = {"counted": mean, "formula": formula.get(a)}
            else:
                row[f"{a} MiB/step"] = row[f"{a} formula"] = "-"
        row["loss - dp4"] = blocks[0][-1]["loss"] - base_loss
        row["_counted MiB"] = sum(row[f"{a} MiB/step"] for a in axes)
        rows.append(row)
    for row in rows:
        row["tokens/s vs dp4 zero0"] = row["tokens/s"] / base_tps if base_tps else float("nan")
    worst = max(abs(r["loss - dp4"]) for r in rows)
    gemini = [n for n in names if n.startswith("gemini")]
    report = Report(
        name="hybrid",
        title=(
            f"Layouts of {WORLD} ranks, GPT {cfg.num_layers}x{cfg.hidden_size} "
            f"({per_rank[0]['num_params'] / 1e6:.1f}M params, fp32), global batch "
            f"{batch}x{seq}: tokens/s, and counted bytes per axis against their formulas"
        ),
        columns=[
            "layout",
            "mesh",
            "tokens/s",
            "tokens/s vs dp4 zero0",
            *(c for a in AXES for c in (f"{a} MiB/step", f"{a} formula")),
            "loss - dp4",
        ],
        rows=rows,
        summary={
            "fastest on this machine": max(rows, key=lambda r: r["tokens/s"])["layout"],
            "fewest counted payload bytes per rank and step (Gemini's dp not counted)": min(
                (r for r in rows if not r["layout"].startswith("gemini")),
                key=lambda r: r["_counted MiB"],
            )["layout"],
            "largest |loss - dp4| after the timed steps": worst,
            "(layout, axis) pairs whose counted bytes equal the formula to the byte": (
                f"{sum(pairs)} of {len(pairs)}"
            ),
            "layouts": len(rows),
        },
        notes=[
            f"One {WORLD}-rank gloo world on loopback; layouts take turns in blocks of {steps} "
            f"timed steps (after one warmup step each), {rounds} round(s), round robin; "
            "tokens/s is global tokens over the slowest rank's time per block, summed over rounds.",
            "Bytes: counted payload per rank and step of the mesh's collectives (all-reduce, "
            "all-gather, reduce-scatter, all-to-all, point-to-point sends and receives), mean over the 4 ranks, from "
            "booster.memory_stats(); ZeRO's dp bytes from its own counter. They are exact and "
            "carry over to GPUs (NCCL moves the same payloads). Payload is not wire: a ring "
            "all-reduce of P bytes sends about 2P per rank, a reduce-scatter or all-gather of "
            "P about P, so ZeRO-1/2's reduce-scatter + all-gather (2P counted) and Megatron "
            "sp's all-gather + reduce-scatter send what one all-reduce (P counted) sends.",
            _gemini_dp_note(gemini),
            "Formula columns: the bytes of the same step from colossal-parallel's per-layer "
            "formulas (benchmarks/_hybrid_bytes.py: block_comm_bytes_1d, linear_comm_bytes, "
            "layernorm_comm_bytes, embedding_comm_bytes, cross_entropy_comm_bytes, "
            "ring_attention_comm_bytes, ulysses_comm_bytes, pipeline_p2p_bytes, plus the model "
            "boundary's collectives: vocabulary-parallel embedding and head, grid tied head, "
            "loss scalars; dp from the parameters each rank holds); 'equal' means equal to the "
            "byte over all ranks and timed steps, else the formula's MiB and counted - formula. "
            "Point-to-point messages (pipeline boundaries, the tied embedding's gradient, ring "
            "attention's key/value blocks) are counted by the sender and again by the receiver, "
            "so the pp and ring sp columns are twice the bytes pipeline_p2p_bytes and "
            "ring_attention_comm_bytes give (those count what a rank sends, the wire bytes).",
            "What the times do NOT say about GPUs: gloo on loopback is a memcpy through the "
            "kernel, so communication is nearly free next to compute, the opposite of a GPU "
            "cluster, where NVLink or InfiniBand time decides the layout. All 4 ranks share 2 "
            "CPU cores (and this machine was loaded by other jobs during the run), so a layout "
            "that splits compute (tp, pp) gains nothing from more devices here, while it would "
            "on GPUs; pipeline bubbles cost idle time that another rank's compute fills on a "
            "shared CPU. Read the tokens/s as overheads of the implementations at this size "
            "(extra kernels, partitioned GEMMs, schedule bookkeeping), not as GPU speed.",
            "What the bytes DO say: dp moves the gradients of the rank's parameters once per "
            "step (payload = their bytes; 2x counted for ZeRO-1/2), independent of the batch; "
            "tp moves "
            "activations (grows with batch x seq, not with parameters); pp sends one boundary "
            "activation per micro-batch per stage, far fewer bytes than tp; ring sp moves "
            "keys/values around the ring. Divide by a link's bandwidth to get a lower bound on "
            "a GPU's communication time per step.",
            "The loss column checks that every layout trained the same model on the same "
            "batches: all equal single-process AdamW within 1e-5 in the tests; here the "
            "difference to dp4 zero0 after the last timed step.",
            load_note(load_before, "the tokens/s move with it, the bytes do not"),
        ],
    )
    return report
