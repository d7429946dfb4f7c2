"""Lazy init + disk tier: GPTs whose states exceed the host budget H several times train 3 steps,
built eagerly and inside ``colossal.lazy_init()``; the process's peak RSS (psutil, sampled every
2 ms on a thread) during setup and during training, against H + B (host and emulated accelerator
budgets) above the fixed overhead.

The fixed overhead is the process's RSS just before the measured model is built, after the same
code ran once on a tiny model (GPT width 32, 2 layers, 2 steps under Gemini with a disk tier,
built inside ``lazy_init()``): Python, torch and the libraries, the modules torch imports for its
meta-device kernels (~800 of them), and library pages a first step touches. None of it depends
on the model's size. Each trial runs in a fresh process. The aim: setup and training peaks
<= overhead + H + B + a few chunks (what is over: see the notes).
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
from colossal_chunk import trim_host_heap
from colossal_models import GPT, GPTConfig

from _report import Report

MiB = 2**20
_COLUMNS = [
    "method",
    "layers",
    "params",
    "states_MiB",
    "states_over_H",
    "H_MiB",
    "B_MiB",
    "chunk_MiB",
    "overhead_MiB",
    "setup_peak_over_overhead_MiB",
    "setup_over_H_plus_B_MiB",
    "train_peak_over_overhead_MiB",
    "train_over_H_plus_B_MiB",
    "train_over_H_plus_B_chunks",
    "host_peak_MiB",
    "acc_peak_MiB",
    "disk_peak_MiB",
    "final_loss",
]


class _PeakRss:
    """The highest RSS of this process while the block runs, sampled on a thread."""

    def __init__(self) -> None:
        self.proc, self.peak, self._stop = psutil.Process(), 0, threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(0.002)

    def __enter__(self) -> _PeakRss:
        self.peak = self.proc.memory_info().rss
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, self.proc.memory_info().rss)


def _cfg(layers: int, width: int) -> GPTConfig:
    return GPTConfig(
        vocab_size=256, max_seq_len=16, num_layers=layers, num_heads=4, hidden_size=width
    )


def _boost(model, lazy, b: int, h: int, disk: Path):  # type: ignore[no-untyped-def]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    plugin = GeminiPlugin(
        accelerator_budget=b, host_budget=h, disk_budget="8GiB", disk_dir=disk, lazy=lazy
    )
    booster = Booster(plugin)
    gm, gopt = booster.boost(model, opt)
    return plugin, booster, gm, gopt


def _steps(booster, gm, gopt, x: torch.Tensor, n: int) -> list[float]:  # type: ignore[no-untyped-def]
    losses = []
    for _ in range(n):
        loss = gm(x, x)
        booster.backward(loss, gopt)
        gopt.step()
        gopt.zero_grad()
        losses.append(loss.item())
    return losses


def _warm_up(x: torch.Tensor, disk: Path) -> None:
    """The same code once on a tiny model, so the overhead holds what any model's run loads."""
    with lazy_init() as lazy:
        model = GPT(_cfg(2, 32))
    _, booster, gm, gopt = _boost(model, lazy, 1 * MiB, 128 * 1024, disk)
    _steps(booster, gm, gopt, x, 2)
    gm.runtime.manager.close()


def _trial(layers: int, width: int, lazy_mode: bool, b: int, h: int, disk: Path) -> dict:
    cfg = _cfg(layers, width)
    x = torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(0))
    _warm_up(x, disk)
    gc.collect()
    trim_host_heap()
    base = psutil.Process().memory_info().rss
    torch.manual_seed(0)
    with _PeakRss() as setup:
        if lazy_mode:
            with lazy_init() as lazy:
                model = GPT(cfg)
        else:
            lazy, model = None, GPT(cfg)
        plugin, booster, gm, gopt = _boost(model, lazy, b, h, disk)
        del model
    with _PeakRss() as training:
        losses = _steps(booster, gm, gopt, x, 3)
    stats = plugin.memory_stats()
    chunk = gm.runtime.manager.chunk_numel * 4  # fp32 chunks
    gm.runtime.manager.close()
    budgets = h + b
    setup_over, train_over = setup.peak - base, training.peak - base
    return {
        "method": "lazy init" if lazy_mode else "eager init",
        "layers": layers,
        "params": cfg.num_params(),
        "states_MiB": cfg.num_params() * 16 / MiB,
        "states_over_H": cfg.num_params() * 16 / h,
        "H_MiB": h / MiB,
        "B_MiB": b / MiB,
        "chunk_MiB": chunk / MiB,
        "overhead_MiB": base / MiB,
        "setup_peak_over_overhead_MiB": setup_over / MiB,
        "setup_over_H_plus_B_MiB": (setup_over - budgets) / MiB,
        "train_peak_over_overhead_MiB": train_over / MiB,
        "train_over_H_plus_B_MiB": (train_over - budgets) / MiB,
        "train_over_H_plus_B_chunks": (train_over - budgets) / chunk,
        "host_peak_MiB": stats["host_peak_bytes"] / MiB,
        "acc_peak_MiB": stats["accelerator_peak_bytes"] / MiB,
        "disk_peak_MiB": stats["disk_peak_bytes"] / MiB,
        "final_loss": losses[-1],
    }


def run(quick: bool, out_dir: Path) -> Report:
    width, h, b = (384, 32 * MiB, 16 * MiB) if quick else (512, 64 * MiB, 32 * MiB)
    depths = (4,) if quick else (6, 12)
    where = Path(tempfile.mkdtemp(prefix="bench-lazy-"))
    report = Report(
        name="lazy_rss",
        title=f"Peak RSS while GPTs (width {width}, depth {', '.join(map(str, depths))}) whose "
        f"states exceed H = {h // MiB} MiB several times train 3 steps under B = {b // MiB} MiB "
        "(emulated) + H + disk, eager vs lazy init",
        columns=_COLUMNS,
    )
    try:
        for layers in depths:
            for lazy_mode in (True, False):  # each in a fresh process
                argv = [sys.executable, __file__, str(int(lazy_mode)), str(layers), str(width)]
                argv += [str(b), str(h), str(where)]
                out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
                report.rows.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        shutil.rmtree(where, ignore_errors=True)
    report.summary = _summary(report.rows)
    report.notes = _NOTES
    return report


def _summary(rows: list[dict]) -> dict:
    lazy_rows = [r for r in rows if r["method"] == "lazy init"]
    eager_rows = [r for r in rows if r["method"] == "eager init"]
    worst = max(max(r["setup_over_H_plus_B_MiB"], r["train_over_H_plus_B_MiB"]) for r in lazy_rows)
    return {
        "lazy: worst peak RSS over overhead + H + B (MiB)": worst,
        "lazy: the same in chunks": worst / lazy_rows[0]["chunk_MiB"],
        "lazy: training peak over overhead + H + B, per depth (chunks)": [
            round(r["train_over_H_plus_B_chunks"], 2) for r in lazy_rows
        ],
        "lazy: setup peak over the overhead / H (per depth)": [
            round(r["setup_peak_over_overhead_MiB"] / r["H_MiB"], 3) for r in lazy_rows
        ],
        "eager: setup peak over the overhead / H (per depth)": [
            round(r["setup_peak_over_overhead_MiB"] / r["H_MiB"], 3) for r in eager_rows
        ],
        "same final loss eager and lazy": all(
            a["final_loss"] == e["final_loss"] for a, e in zip(lazy_rows, eager_rows, strict=True)
        ),
    }


_NOTES = [
    "Fixed overhead: the RSS just before the measured model is built, after a warm-up run of a "
    "tiny model through the same code (see the module docstring); peaks are sampled every 2 ms "
    "on a thread (a shorter peak can be missed) and once more at the end of each phase.",
    "Setup (lazy) stays within H plus one chunk's materialized values (test_lazy_init counts "
    "them) and a few MiB of Python objects; eager init holds the whole fp32 model on the host "
    "first, as it must.",
    "What is over H + B in training is a number of chunks, not a share of the model: mostly "
    "the disk tier's read-ahead window, whose pages are mapped into the process before use "
    "(MADV_POPULATE_READ): in the optimizer step the update sets of the current chunk and the "
    "next two (fp32 values, exp_avg, exp_avg_sq and gradients, those on disk: up to 12 chunks; "
    "each set is unmapped once written), in forward and backward the disk chunks of the next 4 "
    "moments. It grew from depth 6 to 12 because more of each update set lives on disk (the "
    "parameter chunks too). Besides (about 4 chunks measured, in anonymous memory): "
    "autograd's gradients before they are copied into chunks and the C heap left from them, "
    "activations (batch 1 x 16 tokens: small).",
    "Emulated accelerator: its budget B is host memory here, counted in RSS.",
    "Disk tier on the machine's disk; page cache that is not mapped is not RSS (dirty disk "
    "pages are bounded by the disk tier's write-behind window).",
    "Shared machine: 2 CPU cores, other jobs running (RSS does not depend on load).",
]


if __name__ == "__main__":  # one trial: lazy(0/1) layers width B H dir -> one JSON line
    lazy_arg, layers_arg, width_arg, b_arg, h_arg, dir_arg = sys.argv[1:7]
    row = _trial(
        int(layers_arg), int(width_arg), lazy_arg == "1", int(b_arg), int(h_arg), Path(dir_arg)
    )
    print(json.dumps(row))
