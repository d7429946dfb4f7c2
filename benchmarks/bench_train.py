"""Step time of `colossal train`'s loop (Booster + DDP plugin, one process) against a plain PyTorch
loop on the same model, data and optimizer, measured side by side in one run (interleaved rounds)."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch

from colossal import Booster, DDPPlugin
from colossal_models import GPT, GPTConfig

from _report import Report


def _step_times(preset: str, steps: int, batch: int, seq: int, boosted: bool) -> list[float]:
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset(preset))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    booster = Booster(DDPPlugin()) if boosted else None
    if booster:
        model, opt = booster.boost(model, opt)
    gen = torch.Generator().manual_seed(0)
    times = []
    for _ in range(steps):
        x, y = torch.randint(0, 256, (2, batch, seq), generator=gen)
        t0 = time.perf_counter()
        loss = model(x, y)
        booster.backward(loss, opt) if booster else loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    return times[1:]  # first step warms caches


def run(quick: bool, out_dir: Path) -> Report:
    presets = ["nano", "micro"] if quick else ["micro", "tiny", "mini"]
    steps, rounds = (6, 2) if quick else (10, 3)
    batch, seq = 8, 64
    report = Report(
        name="train",
        title="Booster (DDP plugin, 1 process) vs plain PyTorch: step time",
        columns=["preset", "params", "plain_ms", "booster_ms", "ratio"],
    )
    for preset in presets:
        plain, boosted = [], []
        for _ in range(rounds):  # interleave so both see the same machine state
            plain += _step_times(preset, steps, batch, seq, boosted=False)
            boosted += _step_times(preset, steps, batch, seq, boosted=True)
        p, b = statistics.median(plain), statistics.median(boosted)
        report.rows.append(
            {
                "preset": preset,
                "params": GPTConfig.preset(preset).num_params(),
                "plain_ms": p * 1e3,
                "booster_ms": b * 1e3,
                "ratio": b / p,
            }
        )
    report.summary["max ratio"] = max(r["ratio"] for r in report.rows)
    report.notes.append(
        f"batch {batch} x seq {seq}, AdamW; medians of {rounds} interleaved rounds "
        f"of {steps - 1} timed steps each. On one process the DDP plugin does not wrap "
        "the model, so the ratio should be ~1.0: this measures the Booster's own cost."
    )
    return report
