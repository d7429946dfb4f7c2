"""Scaling: step time of Gemini (no budget, and a quarter budget), DDP and FSDP2 with CPU
offload on 1, 2 and 4 data-parallel ranks, with plain fused AdamW on one rank as the yardstick,
measured side by side in one run (methods alternate step by step, same model and batches)."""

from __future__ import annotations

import os
import resource
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from colossal_models import GPT, GPTConfig
from colossal_testing import World
from colossal_zero import GeminiConfig, GeminiOptimizer, apply_gemini

from _report import Report
from _stock_gpt import StockGPT

LR = 1e-3
# Warm-up rounds (every method one step): at least WARM_MIN (Gemini's traced warmup, re-pack and
# state-placement measurement), then until a round's minor page faults on the most-faulting rank
# are at most STEADY_FAULTS, or WARM_MAX rounds. Methods alternating in one process share its
# heap: until it has grown to what all of them hold at once, a step's buffers land on pages
# touched for the first time (mini on 2 ranks: 10-20 thousand faults and +300-700 ms in a step of
# 500; Gemini alone settles to a few faults a step after its warmup).
WARM_MIN, WARM_MAX, STEADY_FAULTS = 3, 10, 1024
STOCK = "stock-"  # a preset's prefix: the same shapes built from stock torch modules
GEMINI, GEMINI_S, GEMINI_Q, DDP, FSDP, PLAIN = (
    "Gemini",
    "Gemini 0.6 states",
    "Gemini 1/4 budget",
    "DDP",
    "FSDP2 CPU offload",
    "plain fused AdamW",
)


def _model(preset: str) -> torch.nn.Module:
    """GPT ``preset``, or with ``stock-`` before it the same shapes in stock torch modules."""
    torch.manual_seed(0)
    if preset.startswith(STOCK):
        return StockGPT(GPTConfig.preset(preset.removeprefix(STOCK)))
    return GPT(GPTConfig.preset(preset))


def fsdp2_floor(preset: str) -> int:
    """The least model-data bytes FSDP2 offload holds on the device in a step of ``preset``, as
    ``_Torch`` wraps it (one ``fully_shard`` per block, and the root): the root's parameters,
    unsharded from forward to backward, plus in a block's backward its unsharded parameters and
    gradients and the next block's parameters (all-gathered ahead by its default backward
    prefetch). fp32; activations and collective buffers come on top: a lower bound."""
    model = _model(preset)
    blocks = [sum(p.numel() for p in b.parameters()) * 4 for b in model.blocks]
    root = sum(p.numel() for p in model.parameters()) * 4 - sum(blocks)
    return root + 3 * max(blocks)


class _Gemini:
    def __init__(self, preset: str, budget: int | None, overlap: bool = True):
        cfg = GeminiConfig(precision="fp32", accelerator_bytes=budget, overlap_comm=overlap)
        self.model = apply_gemini(_model(preset), cfg)
        self.opt = GeminiOptimizer.from_torch(
            self.model, torch.optim.AdamW(self.model.module.parameters(), lr=LR)
        )

    def step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.opt.backward(self.model(x, y))
        self.opt.step()
        self.opt.zero_grad()

    def state_bytes(self) -> int:
        """This rank's chunk bytes of every kind: parameters, gradients and Adam's states."""
        return sum(c.shard_bytes for c in self.model.runtime.manager.chunks.values())

    def chunk_bytes(self) -> int:
        """The most bytes chunks held on the compute tier in a step."""
        return self.model.memory_stats().tiers["accelerator"].peak_bytes


class _Torch:
    """Plain fused AdamW on one rank, DDP, or FSDP2 (``fully_shard`` with ``CPUOffloadPolicy``)."""

    def __init__(self, preset: str, kind: str):
        model = _model(preset)
        if kind == DDP:
            self.model: Any = torch.nn.parallel.DistributedDataParallel(model)
        elif kind == FSDP:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

            mesh = init_device_mesh("cpu", (dist.get_world_size(),))
            for block in model.blocks:
                fully_shard(block, mesh=mesh, offload_policy=CPUOffloadPolicy(pin_memory=False))
            self.model = fully_shard(
                model, mesh=mesh, offload_policy=CPUOffloadPolicy(pin_memory=False)
            )
        else:
            self.model = model
        # fused=True where torch has it for these tensors; FSDP2's DTensors take the default
        self.opt = torch.optim.AdamW(model.parameters(), lr=LR, fused=kind != FSDP)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.model(x, y).backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


def _minor_faults() -> int:
    """This process's minor page faults so far (first touches of pages it was given)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _batch(step: int, batch: int, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's rows of step ``step``'s global batch (the same for every method and every
    rank count: ``batch`` rows split evenly over the ranks)."""
    g = torch.Generator().manual_seed(1000 + step)
    x, y = torch.randint(0, 256, (2, batch, seq), generator=g)
    per, r = batch // dist.get_world_size(), dist.get_rank()
    return x[r * per : (r + 1) * per], y[r * per : (r + 1) * per]


def timing_rank(preset: str, batch: int, seq: int, steps: int, paired: int = 0) -> dict[str, Any]:
    """Rank-side: seconds per step of every method, alternated step by step; on one rank then
    ``paired`` more steps of Gemini and plain fused AdamW alone, in pairs (ABBA order), whose
    step-by-step ratios Gemini / plain come back as ``paired``, and as many pairs of Gemini with
    the quarter budget and without one (``paired_budget``: what the budget's moves and operator
    hooks add to a step)."""
    n = dist.get_world_size()
    probe = _Gemini(preset, None)
    for i in range(2):
        probe.step(*_batch(i, batch, seq))
    resident = probe.chunk_bytes()
    states = int(0.6 * probe.state_bytes())  # the 0.6-states budget
    del probe
    methods: dict[str, Any] = {
        GEMINI: _Gemini(preset, None),
        GEMINI_S: _Gemini(preset, states),
        GEMINI_Q: _Gemini(preset, resident // 4),
        DDP: _Torch(preset, DDP),
        FSDP: _Torch(preset, FSDP),
    }
    if n == 1:
        methods[PLAIN] = _Torch(preset, PLAIN)
    times: dict[str, list[float]] = {k: [] for k in methods}
    faults: dict[str, list[int]] = {k: [] for k in methods}
    warm, warm_faults, i = None, 0, 0  # warm-up rounds, decided as they run (below)
    while warm is None or i < warm + steps:
        order = list(methods.items())
        k = i % len(order)
        order = order[k:] + order[:k]  # rotate: no method always runs first
        round_faults = 0
        for name, m in order:
            x, y = _batch(i, batch, seq)
            dist.barrier()
            f0, t0 = _minor_faults(), time.perf_counter()
            m.step(x, y)
            dist.barrier()
            t, f = time.perf_counter() - t0, _minor_faults() - f0
            round_faults += f
            if warm is not None:
                times[name].append(t)
                faults[name].append(f)
        i += 1
        if warm is None:  # the same decision on every rank: the most-faulting rank's count
            most = torch.tensor([round_faults])
            dist.all_reduce(most, op=dist.ReduceOp.MAX)
            if i >= WARM_MIN and (int(most) <= STEADY_FAULTS or i >= WARM_MAX):
                warm, warm_faults = i, int(most)
    moved = methods[GEMINI_Q].model.memory_stats().bytes_moved
    moved_s = methods[GEMINI_S].model.memory_stats().bytes_moved
    ratios: list[float] = []
    budget_ratios: list[float] = []
    if n == 1:
        for a, b, out in ((GEMINI, PLAIN, ratios), (GEMINI_Q, GEMINI, budget_ratios)):
            for j in range(paired):  # the same batch for both; the first of a pair alternates
                pair = {}
                for name in (a, b) if j % 2 == 0 else (b, a):
                    x, y = _batch(steps + warm + j, batch, seq)
                    t0 = time.perf_counter()
                    methods[name].step(x, y)
                    pair[name] = time.perf_counter() - t0
                out.append(pair[a] / pair[b])
    return {
        "times": times,
        "resident": resident,
        "quarter": resident // 4,
        "moved": moved,
        "states": states,
        "moved_states": moved_s,
        "paired": ratios,
        "paired_budget": budget_ratios,
        "warm": warm,
        "warm_faults": warm_faults,
        "faults": {k: statistics.median(v) for k, v in faults.items()},
    }


def _spread(ts: list[float]) -> str:
    q = statistics.quantiles(ts, n=4) if len(ts) >= 2 else [ts[0], ts[0], ts[0]]
    return f"{q[0] * 1e3:.0f}-{q[2] * 1e3:.0f}"


def run(quick: bool, out_dir: Path) -> Report:
    presets = ["tiny", "stock-tiny"] if quick else ["tiny", "mini", "stock-tiny", "stock-mini"]
    ranks = (1, 2) if quick else (1, 2, 4)
    batch, seq = (4, 64) if quick else (8, 64)
    steps = {"tiny": 3 if quick else 12, "mini": 3 if quick else 6}
    paired = {"tiny": 8 if quick else 24, "mini": 12}  # one rank: Gemini vs plain fused alone
    for p in ("tiny", "mini"):
        steps[STOCK + p], paired[STOCK + p] = steps[p], paired[p]
    rows: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}
    load_before = os.getloadavg()[0]
    for n in ranks:
        with World(n, timeout_s=1800) as world:
            for preset in presets:
                r = world.run(timing_rank, preset, batch, seq, steps[preset], paired[preset])[0]
                med = {k: statistics.median(v) for k, v in r["times"].items()}
                # each step ran every method once (rotated): the median of the step-by-step
                # ratios cancels load that drifts between steps, as the medians do not
                fsdp = r["times"][FSDP]
                pair = {
                    k: statistics.median(a / f for a, f in zip(v, fsdp, strict=True))
                    for k, v in r["times"].items()
                }
                base = med.get(PLAIN)
                for name, ts in r["times"].items():
                    rows.append(
                        {
                            "preset": preset,
                            "ranks": n,
                            "method": name,
                            "median ms": med[name] * 1e3,
                            "IQR ms": _spread(ts),
                            "vs FSDP2 offload": med[name] / med[FSDP],
                            "vs FSDP2 offload (paired)": pair[name],
                            "vs DDP": med[name] / med[DDP],
                            "vs plain fused (1 rank)": med[name] / base if base else "",
                            "page faults/step": r["faults"][name],
                        }
                    )
                summary[f"{preset} {n} ranks: warm-up rounds, faults in the last"] = (
                    f"{r['warm']}, {r['warm_faults']:,}"
                )
                for g in (GEMINI, GEMINI_S, GEMINI_Q):
                    summary[f"{preset} {n} ranks: {g} / FSDP2 offload (medians)"] = (
                        med[g] / med[FSDP]
                    )
                    summary[f"{preset} {n} ranks: {g} / FSDP2 offload, paired"] = pair[g]
                if base:
                    summary[f"{preset} 1 rank: Gemini / plain fused AdamW (medians)"] = (
                        med[GEMINI] / base
                    )
                    summary[
                        f"{preset} 1 rank: Gemini / plain fused AdamW, median of "
                        f"{len(r['paired'])} paired steps"
                    ] = statistics.median(r["paired"])
                    summary[
                        f"{preset} 1 rank: Gemini 1/4 budget / Gemini no budget, median of "
                        f"{len(r['paired_budget'])} paired steps"
                    ] = statistics.median(r["paired_budget"])
                summary[f"{preset} {n} ranks: 1/4 budget (bytes), moved MiB over the run"] = (
                    f"{r['quarter']:,}, {r['moved'] / 2**20:.1f}"
                )
                summary[f"{preset} {n} ranks: 0.6 states (bytes), moved MiB over the run"] = (
                    f"{r['states']:,}, {r['moved_states'] / 2**20:.1f}"
                )
                floor = fsdp2_floor(preset)
                summary[f"{preset} {n} ranks: 0.6 states, 1/4 budget / FSDP2's device floor"] = (
                    f"{r['states'] / floor:.2f}, {r['quarter'] / floor:.2f}"
                )
    paired_ratios = [v for k, v in summary.items() if k.endswith("FSDP2 offload, paired")]
    median_ratios = [v for k, v in summary.items() if k.endswith("FSDP2 offload (medians)")]
    ones = [v for k, v in summary.items() if "plain fused AdamW, median of" in k]
    summary["aim: Gemini (every budget) at or below FSDP2 offload everywhere (paired)"] = all(
        v <= 1.0 for v in paired_ratios
    )
    moving = {  # each budget that moves chunks, on 2 ranks or more: key -> paired ratio
        k: v for k, v in summary.items()
        if k.endswith("FSDP2 offload, paired") and " 1 ranks:" not in k
        and (GEMINI_S in k or GEMINI_Q in k)
    }  # fmt: skip
    summary["aim: Gemini under a moving budget at or below FSDP2 offload on 2+ ranks (paired)"] = (
        all(v <= 1.0 for v in moving.values())
    )
    summary["the same for the 0.6-states budget alone"] = all(
        v <= 1.0 for k, v in moving.items() if GEMINI_S in k
    )
    summary["the same by the ratio of medians"] = all(v <= 1.0 for v in median_ratios)
    summary["aim: Gemini 1 rank <= 1.05x plain fused AdamW (paired)"] = all(v <= 1.05 for v in ones)
    notes = [
        f"GPT presets {', '.join(presets)} (colossal_models; 'stock-' the same shapes built "
        "from stock torch modules: nn.Embedding, nn.TransformerEncoderLayer pre-norm GELU, "
        f"nn.LayerNorm, an untied nn.Linear head, benchmarks/_stock_gpt.py), fp32, a global batch of {batch} x "
        f"{seq} tokens split evenly over the ranks (the same batches at every rank count: on a "
        "2-core host, more ranks cannot mean more compute), AdamW lr 1e-3 everywhere.",
        "Gemini: apply_gemini + GeminiOptimizer.from_torch(AdamW), overlap_comm on (the "
        "default); '0.6 states': accelerator_bytes = 0.6 of the rank's chunk bytes of every "
        "kind (parameters, gradients, Adam's states: the budget of the case the issue reports); "
        "'1/4 budget': a quarter of the most bytes chunks held on the compute tier in a "
        "no-budget step, where chunks shrink to fit (more chunks: more collectives per step). "
        "Both move chunks every step (moved MiB in the summary). DDP: "
        "DistributedDataParallel + fused AdamW. FSDP2: fully_shard per block and at the root with "
        "CPUOffloadPolicy, AdamW (foreach; fused does not take its DTensors on CPU). Plain: the "
        "unwrapped model + fused AdamW, one rank only.",
        "FSDP2's device floor (per preset, any rank count): the model data FSDP2 offload "
        "cannot do without on the device: the root's parameters (unsharded from forward to "
        "backward) and, in a block's backward, that block's unsharded parameters and gradients "
        "and the next block's parameters (its default backward prefetch); fp32, activations "
        "not counted (a lower bound). A Gemini budget covers chunks and activations both; "
        "where it is below the floor, Gemini trains in less device memory than FSDP2 offload "
        "can, and its step is compared with one that holds more.",
        "The accelerator is emulated: compute runs on the CPU and Gemini's accelerator tier is a "
        "byte budget, so moves are memory copies, FSDP2's offload copies CPU to CPU, and "
        "collectives run on gloo over loopback. Gemini reduce-scatters a gradient chunk there "
        "as one all-to-all and a local sum (colossal-chunk's [Note: reduce-scatter on gloo]: "
        "gloo's own reduce_scatter measured 2-3x slower on this host); FSDP2 runs gloo's "
        "reduce_scatter as torch ships it, DDP its all-reduce; on NCCL Gemini runs NCCL's.",
        "Per rank count one process world; every method runs each step (barrier, step, barrier) "
        "in a rotating order; warm-up rounds dropped: at least 3 (Gemini's traced warmup, "
        "re-pack and state-placement measurement), then until a round's minor page faults on "
        f"the most-faulting rank are at most {STEADY_FAULTS:,} (or {WARM_MAX} rounds): methods "
        "alternating in one process share its heap, and until it has grown to what all of them "
        "hold, a step's buffers land on pages touched for the first time (tens of thousands of "
        "faults, +300-700 ms in a 500 ms mini step on 2 ranks); 'page faults/step' is rank 0's "
        f"median over the timed steps; {steps['tiny']} (tiny) / {steps['mini']} (mini) timed "
        "steps: median and inter-quartile range (rank 0's clock), and 'paired': the median "
        "over the steps of each step's ratio to FSDP2's step (both ran in that step, in "
        "rotated order), which cancels load that drifts between steps; the aim reads the "
        "paired ratio, the ratio of medians is given beside it.",
        f"One rank, after that: {paired['tiny']} (tiny) / {paired['mini']} (mini) more steps of "
        "Gemini and plain fused AdamW alone, in pairs on the same batch with the first of a pair "
        "alternating; the aim reads the median of the pairs' ratios (a ratio per pair cancels "
        "load that drifts over the run); then as "
        "many pairs of Gemini with the 1/4 budget and without one, the same way.",
        f"Host: {os.cpu_count()} cores; 1-minute load average {load_before:.1f} before the run "
        f"and {os.getloadavg()[0]:.1f} at its end (the run's own ranks count). 4 ranks share "
        "those cores: absolute times are large; the ratios taken within one rank count are "
        "what to read, and they move with the load.",
    ]
    return Report(
        name="scaling",
        title="Gemini vs DDP vs FSDP2 (CPU offload): step time on 1, 2 and 4 data-parallel ranks",
        columns=["preset", "ranks", "method", "median ms", "IQR ms", "vs FSDP2 offload",
                 "vs FSDP2 offload (paired)",
                 "vs DDP", "vs plain fused (1 rank)", "page faults/step"],
        rows=rows,
        summary=summary,
        notes=notes,
    )  # fmt: skip
