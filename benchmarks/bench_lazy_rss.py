"""Lazy init + disk tier: a GPT whose states exceed the host budget H trains 3 steps from
``colossal.lazy_init()``; the process's RSS (psutil, sampled every 5 ms on a thread) during
setup and training, against H plus the fixed overhead measured before the model exists.

Side by side in one process: eager construction (the whole fp32 model in host memory before
Gemini takes it) and lazy construction (each chunk materialized straight into its tier). Both under
an emulated accelerator budget B, host budget H and a disk tier.
"""

from __future__ import annotations

import gc
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import torch

from colossal import Booster, GeminiPlugin, lazy_init
from colossal_models import GPT, GPTConfig

from _report import Report

MiB = 2**20


class _PeakRss:
    def __init__(self) -> None:
        self.proc, self.peak, self._stop = psutil.Process(), 0, threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(0.005)

    def __enter__(self) -> _PeakRss:
        self.peak = self.proc.memory_info().rss
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()


def _trial(cfg: GPTConfig, lazy_mode: bool, b: str, h: int, disk: Path) -> dict:
    gc.collect()
    base = psutil.Process().memory_info().rss
    torch.manual_seed(0)
    x = torch.randint(0, 256, (1, 16))
    with _PeakRss() as setup:
        if lazy_mode:
            with lazy_init() as lazy:
                model = GPT(cfg)
        else:
            lazy, model = None, GPT(cfg)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        plugin = GeminiPlugin(
            accelerator_budget=b, host_budget=h, disk_budget="2GiB", disk_dir=disk, lazy=lazy
        )
        booster = Booster(plugin)
        gm, gopt = booster.boost(model, opt)
        del model
    losses = []
    with _PeakRss() as training:
        for _ in range(3):
            loss = gm(x, x)
            booster.backward(loss, gopt)
            gopt.step()
            gopt.zero_grad()
            losses.append(loss.item())
    stats = plugin.memory_stats()
    gm.runtime.manager.close()
    return {
        "method": "lazy init" if lazy_mode else "eager init",
        "params": cfg.num_params(),
        "states_MiB": cfg.num_params() * 16 / MiB,
        "H_MiB": h / MiB,
        "overhead_MiB": base / MiB,
        "setup_peak_over_overhead_MiB": (setup.peak - base) / MiB,
        "train_peak_over_overhead_MiB": (training.peak - base) / MiB,
        "host_peak_MiB": stats["host_peak_bytes"] / MiB,
        "disk_peak_MiB": stats["disk_peak_bytes"] / MiB,
        "final_loss": losses[-1],
    }


def run(quick: bool, out_dir: Path) -> Report:
    h = (32 if quick else 128) * MiB
    layers = 4 if quick else 12
    cfg = _cfg(layers)
    where = Path(tempfile.mkdtemp(prefix="bench-lazy-"))
    report = Report(
        name="lazy_rss",
        title=f"RSS while a GPT ({cfg.num_params():,} params, {cfg.num_params() * 16 / MiB:,.0f} MiB "
        f"of states) trains 3 steps under H = {h // MiB} MiB host + disk, eager vs lazy init",
        columns=[
            "method",
            "params",
            "states_MiB",
            "H_MiB",
            "overhead_MiB",
            "setup_peak_over_overhead_MiB",
            "train_peak_over_overhead_MiB",
            "host_peak_MiB",
            "disk_peak_MiB",
            "final_loss",
        ],
    )
    try:
        for lazy_mode in (True, False):  # each in a fresh process: RSS starts from the same place
            argv = [sys.executable, __file__, str(int(lazy_mode)), str(layers), str(h), str(where)]
            out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
            report.rows.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        shutil.rmtree(where, ignore_errors=True)
    lazy_row, eager_row = report.rows
    report.summary = {
        "lazy: peak RSS over the fixed overhead / H": max(
            lazy_row["setup_peak_over_overhead_MiB"], lazy_row["train_peak_over_overhead_MiB"]
        )
        / lazy_row["H_MiB"],
        "eager: setup peak RSS over the fixed overhead / H": eager_row[
            "setup_peak_over_overhead_MiB"
        ]
        / eager_row["H_MiB"],
        "same final loss": lazy_row["final_loss"] == eager_row["final_loss"],
    }
    report.notes = [
        "Fixed overhead = the process's RSS just before the model is built (Python, torch, the "
        "libraries, earlier allocations); peaks are sampled every 5 ms on a thread, so a peak "
        "shorter than that can be missed.",
        "Emulated accelerator (16 MiB budget on the CPU): its chunk bytes are host RSS too, "
        "so RSS over the overhead may reach H + B + activations.",
        "Each method runs in a fresh process.",
        "Shared machine: 2 CPU cores, other jobs running.",
    ]
    return report


def _cfg(layers: int) -> GPTConfig:
    return GPTConfig(
        vocab_size=256, max_seq_len=16, num_layers=layers, num_heads=4, hidden_size=384
    )


if __name__ == "__main__":  # one trial: lazy(0/1) layers H dir -> one JSON line
    lazy_arg, layers_arg, h_arg, dir_arg = sys.argv[1:5]
    row = _trial(_cfg(int(layers_arg)), lazy_arg == "1", "16MiB", int(h_arg), Path(dir_arg))
    print(json.dumps(row))
