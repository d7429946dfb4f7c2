"""Per-rank model-state bytes of DDP, ZeRO-1, ZeRO-2 and Gemini at dp = 1, 2, 4 against the ZeRO
paper's formulas; step time of ZeRO-1/2 against DDP on 2 ranks; counted bytes per step.

Model states are measured from the storages each method holds after a step (each storage once):
parameters, gradients, fp32 masters, Adam moments. ZeRO-1/2 and Gemini train in bf16 with fp32
masters (the paper's mixed precision: 16, 4 + 12/N, 2 + 14/N, 16/N bytes per parameter); DDP is
torch's ``DistributedDataParallel`` in fp32 with ``gradient_as_bucket_view`` (4 + 4 + 8 = 16
bytes per parameter, the same total). Step time runs DDP, ZeRO-1 and ZeRO-2 in fp32 on the same
2 ranks, one step of each in turn, and reports the median per method. Collective bytes are
counted at the call sites (DDP through a comm hook); wire bytes per rank assume ring algorithms.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

from colossal_models import GPT, GPTConfig
from colossal_testing import World
from colossal_zero import (
    GeminiConfig,
    GeminiOptimizer,
    LowLevelZeroOptimizer,
    ZeroConfig,
    apply_gemini,
)

from _report import Report

FORMULA = {  # bytes per parameter, mixed precision (ZeRO paper, Rajbhandari et al. 2020)
    "ddp": lambda n: 16.0,
    "zero1": lambda n: 4 + 12 / n,
    "zero2": lambda n: 2 + 14 / n,
    "gemini": lambda n: 16 / n,
}
BUCKET = 1 << 18
WIRE = {  # ring wire bytes per rank per step, per parameter: all-reduce of fp32 gradients (DDP);
    # reduce-scatter of bf16 gradients + all-gather of bf16 parameters (ZeRO-1/2)
    "ddp": lambda n: 2 * (n - 1) / n * 4,
    "zero1": lambda n: (n - 1) / n * (2 + 2),
    "zero2": lambda n: (n - 1) / n * (2 + 2),
}


def _model(preset: str) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig.preset(preset))


def _batch(preset: str, batch: int, seq: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step + 1000 * dist.get_rank())
    return tuple(torch.randint(0, 256, (2, batch, seq), generator=g))  # type: ignore[return-value]


def _storage_bytes(tensors) -> int:  # type: ignore[no-untyped-def]
    seen, total = set(), 0
    for t in tensors:
        if t is None:
            continue
        s = t.untyped_storage()
        if s.data_ptr() not in seen:
            seen.add(s.data_ptr())
            total += s.nbytes()
    return total


class _DDP:
    """torch DDP + AdamW, counting all-reduced bytes through a comm hook."""

    def __init__(self, preset: str):
        self.plain = _model(preset)
        self.model = torch.nn.parallel.DistributedDataParallel(
            self.plain, gradient_as_bucket_view=True, bucket_cap_mb=1
        )
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.comm = 0

        def hook(state, bucket):  # type: ignore[no-untyped-def]
            buf = bucket.buffer()
            self.comm += buf.numel() * buf.element_size()
            buf.div_(dist.get_world_size())
            return dist.all_reduce(buf, async_op=True).get_future().then(lambda f: f.value()[0])

        self.model.register_comm_hook(None, hook)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.model(x, y).backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=False)

    def state_bytes(self) -> int:
        ps = list(self.plain.parameters())
        states = [t for st in self.opt.state.values() for t in st.values() if t.dim() > 0]
        return _storage_bytes(ps) + _storage_bytes(p.grad for p in ps) + _storage_bytes(states)


class _Zero:
    def __init__(self, preset: str, stage: int, precision: str):
        self.model = _model(preset)
        cfg = ZeroConfig(stage=stage, precision=precision, bucket_numel=BUCKET)
        self.opt = LowLevelZeroOptimizer(self.model, self.model.parameters(), lr=1e-3, config=cfg)

    @property
    def comm(self) -> int:
        return sum(self.opt.comm_bytes.values())

    def step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.opt.backward(self.model(x, y))
        self.opt.step()
        self.opt.zero_grad()

    def state_bytes(self) -> int:
        return sum(self.opt.model_state_bytes().values())


class _Gemini:
    comm = 0  # not counted by Gemini's runtime

    def __init__(self, preset: str):
        self.model = apply_gemini(_model(preset), GeminiConfig(precision="bf16"))
        self.opt = GeminiOptimizer(self.model, lr=1e-3)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.opt.backward(self.model(x, y))
        self.opt.step()
        self.opt.zero_grad()

    def state_bytes(self) -> int:
        return sum(t.used_bytes for t in self.model.memory_stats().tiers.values())


def memory_rank(preset: str, batch: int, seq: int) -> dict[str, float]:
    """Rank-side: model-state bytes per parameter of each method after two steps."""
    num = sum(p.numel() for p in _model(preset).parameters())
    out: dict[str, float] = {"params": num}
    makers = {
        "ddp": lambda: _DDP(preset),
        "zero1": lambda: _Zero(preset, 1, "bf16"),
        "zero2": lambda: _Zero(preset, 2, "bf16"),
        "gemini": lambda: _Gemini(preset),
    }
    for name, make in makers.items():
        m = make()
        for i in range(2):
            m.step(*_batch(preset, batch, seq, i))
        comm0 = m.comm
        m.step(*_batch(preset, batch, seq, 2))
        out[name] = m.state_bytes()
        out[f"{name}_comm"] = m.comm - comm0
        del m
    return out


def timing_rank(preset: str, batch: int, seq: int, steps: int) -> dict[str, list[float]]:
    """Rank-side: seconds per step of DDP, ZeRO-1 and ZeRO-2 (fp32), alternated step by step."""
    methods = {
        "ddp": _DDP(preset),
        "zero1": _Zero(preset, 1, "fp32"),
        "zero2": _Zero(preset, 2, "fp32"),
    }
    times: dict[str, list[float]] = {k: [] for k in methods}
    for i in range(steps + 2):
        order = list(methods.items())
        if i % 2:
            order.reverse()
        for name, m in order:
            x, y = _batch(preset, batch, seq, i)
            dist.barrier()
            t0 = time.perf_counter()
            m.step(x, y)
            dist.barrier()
            if i >= 2:  # warm-up steps dropped
                times[name].append(time.perf_counter() - t0)
    return times


def run(quick: bool, out_dir: Path) -> Report:
    # model states are a per-parameter ratio: the micro preset shows it; time on a larger one
    preset, timed = "micro", ("micro" if quick else "tiny")
    batch, seq, steps = (2, 64, 6) if quick else (4, 128, 20)
    rows = []
    for n in (1, 2, 4):
        with World(n, timeout_s=1800) as world:
            per = world.run(memory_rank, preset, batch, seq)
        r = per[0]
        num = r["params"]
        for name in FORMULA:
            measured = r[name] / num
            formula = FORMULA[name](n)
            wire = r[f"{name}_comm"] * (n - 1) / n * (2 if name == "ddp" else 1)
            rows.append(
                {
                    "method": name,
                    "dp": n,
                    "params": int(num),
                    "measured B/param": measured,
                    "formula B/param": formula,
                    "measured / formula": measured / formula,
                    "counted MiB/step": r[f"{name}_comm"] / 2**20 if name != "gemini" else "n/a",
                    "wire MiB/step": wire / 2**20 if name != "gemini" else "n/a",
                    "formula wire MiB/step": WIRE[name](n) * num / 2**20
                    if name != "gemini"
                    else "n/a",
                }
            )
    with World(2, timeout_s=1800) as world:
        times = world.run(timing_rank, timed, batch, seq, steps)[0]
    med = {k: statistics.median(v) for k, v in times.items()}
    summary = {
        "zero1 / ddp step time (2 ranks, fp32)": med["zero1"] / med["ddp"],
        "zero2 / ddp step time (2 ranks, fp32)": med["zero2"] / med["ddp"],
        "worst measured / formula (model states)": max(
            r["measured / formula"] for r in rows if r["method"] != "gemini"
        ),
        "gemini measured / formula": max(
            r["measured / formula"] for r in rows if r["method"] == "gemini"
        ),
    }
    notes = [
        f"Model states: GPT preset {preset!r}, after a step, from the storages held (each "
        f"once). Step time: GPT preset {timed!r}, batch {batch} x {seq} tokens per rank.",
        "ZeRO-1/2 and Gemini in bf16 with fp32 masters; DDP in fp32 (16 B/param either way).",
        "Stated buffers beyond the formulas: bucket padding to a multiple of dp (at most "
        "dp - 1 elements per bucket); ZeRO-2's transient per-bucket gradient buffers during "
        "backward (not at rest); Gemini's chunk padding. Gemini keeps gradients in the "
        "parameter chunk's own slots, so its at-rest figure is 14/N, under the paper's 16/N.",
        "Counted bytes are the collective buffers: DDP all-reduces the gradient buckets (wire: "
        "2(N-1)/N of them per rank on a ring), ZeRO-1/2 reduce-scatter the gradient buckets "
        "and all-gather the parameter buckets (wire: (N-1)/N each). Gemini's gathers are not "
        "counted. With one rank nothing is communicated.",
        "Step time: median of the timed steps, methods alternated step by step in one run on "
        "2 gloo ranks; the machine is a 2-core host shared with other jobs, so absolute times "
        "are noisy and only the ratios mean anything.",
    ]
    return Report(
        name="zero_memory",
        title="ZeRO-1/2 and Gemini model-state memory vs the ZeRO paper, and step time vs DDP",
        columns=[
            "method",
            "dp",
            "params",
            "measured B/param",
            "formula B/param",
            "measured / formula",
            "counted MiB/step",
            "wire MiB/step",
            "formula wire MiB/step",
        ],
        rows=rows,
        summary=summary,
        notes=notes,
    )
