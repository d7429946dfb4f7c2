"""Lazy init + disk tier: GPTs whose states exceed the host budget H several times train 3 steps,
built eagerly and inside ``colossal.lazy_init()``; the process's peak RSS (psutil, sampled every
2 ms on a thread) during setup and during training, against H + B (host and emulated accelerator
budgets) above the fixed overhead.

The fixed overhead is the process's RSS just before the measured model is built, after the same
code ran once on a one-layer model of the same width (2 steps under Gemini with a disk tier,
built inside ``lazy_init()``): Python, torch and the libraries, the modules torch imports for its
meta-device kernels (~800 of them), and library pages a first step at that width touches. None
of it depends on the model's depth. Each trial runs in a fresh process.

The aim (issue 14): training peak <= overhead + H + B + 2 chunks + 8 MiB, at every depth, and
the excess over overhead + H + B flat in depth (three depths). H covers host payloads and the
disk pages read ahead of use (colossal-chunk's [Note: read-ahead window]); B is host memory too
on the emulated accelerator, and it holds the chunks there and the step's non-model bytes
(activations, gradients before they are copied into chunks: the warmup measures them). The
slack is for what no budget counts: the C heap's slack (colossal-chunk's [Note: bounded host
heap]), Python objects, per-chunk books, library pages first touched in training.

"lazy, no read-ahead" (read_ahead_budget=0: all of H for payloads, every disk page faulted in
at use): its RSS in its own process, and its step time against the default window's in one
process, the two models stepped alternately (ABBA; the summary's paired ratio).
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import torch

from colossal import Booster, GeminiPlugin, lazy_init
from colossal.booster import GeminiConfig
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
    "window_MiB",
    "overhead_MiB",
    "setup_peak_over_overhead_MiB",
    "setup_over_H_plus_B_MiB",
    "train_peak_over_overhead_MiB",
    "train_over_H_plus_B_MiB",
    "train_over_H_plus_B_chunks",
    "within_aim",
    "ahead_peak_MiB",
    "host_peak_MiB",
    "acc_peak_MiB",
    "disk_peak_MiB",
    "step_s",
    "final_loss",
]
_SLACK_CHUNKS, _SLACK_MIB = 2, 8  # the aim's slack over overhead + H + B
_BARE = "lazy, no read-ahead"
_METHODS = {
    "lazy init": (True, None),
    "eager init": (False, None),
    _BARE: (True, 0),
}
_PAIRED_STEPS = 5  # per method in the paired timing; the first (warmup trace) is not timed


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


def _boost(model, lazy, b: int, h: int, disk: Path, window: int | None = None):  # type: ignore[no-untyped-def]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    config = GeminiConfig(
        accelerator_bytes=b,
        host_bytes=h,
        disk_bytes=8 << 30,
        disk_dir=disk,
        read_ahead_bytes=window,
    )
    plugin = GeminiPlugin(config=config, lazy=lazy)
    booster = Booster(plugin)
    gm, gopt = booster.boost(model, opt)
    return plugin, booster, gm, gopt


def _steps(booster, gm, gopt, x: torch.Tensor, n: int) -> tuple[list[float], list[float]]:  # type: ignore[no-untyped-def]
    """Losses and seconds of ``n`` training steps."""
    losses, seconds = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        loss = gm(x, x)
        booster.backward(loss, gopt)
        gopt.step()
        gopt.zero_grad()
        losses.append(loss.item())
        seconds.append(time.perf_counter() - t0)
    return losses, seconds


def _warm_up(x: torch.Tensor, width: int, b: int, h: int, disk: Path) -> None:
    """The same code once on a one-layer model of the same width (a quarter of H, so its
    states spill to disk), so the overhead holds what any depth's run loads."""
    with lazy_init() as lazy:
        model = GPT(_cfg(1, width))
    _, booster, gm, gopt = _boost(model, lazy, b, h // 4, disk)
    _steps(booster, gm, gopt, x, 2)
    gm.runtime.manager.close()


def _trial(layers: int, width: int, method: str, b: int, h: int, disk: Path) -> dict:
    cfg = _cfg(layers, width)
    lazy_mode, window = _METHODS[method]
    x = torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(0))
    _warm_up(x, width, b, h, disk)
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
        plugin, booster, gm, gopt = _boost(model, lazy, b, h, disk, window)
        del model
    with _PeakRss() as training:
        losses, seconds = _steps(booster, gm, gopt, x, 3)
    stats = plugin.memory_stats()
    manager = gm.runtime.manager
    chunk = manager.registry.chunk_numel * 4  # fp32 chunks
    win = manager.shard_io.read_ahead_window
    manager.close()
    budgets = h + b
    setup_over, train_over = setup.peak - base, training.peak - base
    slack = _SLACK_CHUNKS * chunk + _SLACK_MIB * MiB
    return {
        "method": method,
        "layers": layers,
        "params": cfg.num_params(),
        "states_MiB": cfg.num_params() * 16 / MiB,
        "states_over_H": cfg.num_params() * 16 / h,
        "H_MiB": h / MiB,
        "B_MiB": b / MiB,
        "chunk_MiB": chunk / MiB,
        "window_MiB": win.window_bytes / MiB,
        "overhead_MiB": base / MiB,
        "setup_peak_over_overhead_MiB": setup_over / MiB,
        "setup_over_H_plus_B_MiB": (setup_over - budgets) / MiB,
        "train_peak_over_overhead_MiB": train_over / MiB,
        "train_over_H_plus_B_MiB": (train_over - budgets) / MiB,
        "train_over_H_plus_B_chunks": (train_over - budgets) / chunk,
        "within_aim": train_over <= budgets + slack,
        "ahead_peak_MiB": win.peak_bytes / MiB,
        "host_peak_MiB": stats["host_peak_bytes"] / MiB,
        "acc_peak_MiB": stats["accelerator_peak_bytes"] / MiB,
        "disk_peak_MiB": stats["disk_peak_bytes"] / MiB,
        "step_s": statistics.median(seconds[1:]),  # the first step is the warmup trace
        "final_loss": losses[-1],
    }


def _paired(layers: int, width: int, b: int, h: int, disk: Path) -> dict:
    """Step seconds with the default read-ahead window and with none, two lazy models in one
    process stepped alternately (ABBA); medians after each one's first step."""
    x = torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(0))
    runs = []
    for window in (None, 0):
        torch.manual_seed(0)
        with lazy_init() as lazy:
            model = GPT(_cfg(layers, width))
        runs.append(_boost(model, lazy, b, h, disk, window))
        del model
    seconds: list[list[float]] = [[], []]
    for step in range(_PAIRED_STEPS):
        for i in (0, 1) if step % 2 == 0 else (1, 0):
            _, booster, gm, gopt = runs[i]
            seconds[i] += _steps(booster, gm, gopt, x, 1)[1]
    for _, _, gm, _ in runs:
        gm.runtime.manager.close()
    window, none = (statistics.median(t[1:]) for t in seconds)
    return {"layers": layers, "none_s": none, "window_s": window, "ratio": window / none}


def run(quick: bool, out_dir: Path) -> Report:
    width, h, b = (384, 32 * MiB, 16 * MiB) if quick else (512, 64 * MiB, 32 * MiB)
    depths = (4,) if quick else (6, 12, 18)
    where = Path(tempfile.mkdtemp(prefix="bench-lazy-"))
    report = Report(
        name="lazy_rss",
        title=f"Peak RSS while GPTs (width {width}, depth {', '.join(map(str, depths))}) whose "
        f"states exceed H = {h // MiB} MiB several times train 3 steps under B = {b // MiB} MiB "
        "(emulated) + H + disk, eager vs lazy init",
        columns=_COLUMNS,
    )
    load_before = os.getloadavg()[0]
    paired: list[dict] = []
    try:
        for layers in depths:
            for method in _METHODS:  # each in a fresh process
                argv = [sys.executable, __file__, method, str(layers), str(width)]
                argv += [str(b), str(h), str(where)]
                out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
                report.rows.append(json.loads(out.strip().splitlines()[-1]))
            argv = [sys.executable, __file__, "paired", str(layers), str(width)]
            argv += [str(b), str(h), str(where)]
            out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
            paired.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        shutil.rmtree(where, ignore_errors=True)
    report.summary = _summary(report.rows, paired)
    report.notes = _notes(load_before, os.getloadavg()[0])
    return report


def _notes(load_before: float, load_after: float) -> list[str]:
    return [
        *_NOTES,
        f"Load average (1 min): {load_before:.1f} before the run, {load_after:.1f} after it.",
    ]


def _summary(rows: list[dict], paired: list[dict]) -> dict:
    lazy_rows = [r for r in rows if r["method"] == "lazy init"]
    eager_rows = [r for r in rows if r["method"] == "eager init"]
    bare_rows = [r for r in rows if r["method"] == _BARE]
    excess = [r["train_over_H_plus_B_MiB"] for r in lazy_rows]
    worst = max(max(r["setup_over_H_plus_B_MiB"], r["train_over_H_plus_B_MiB"]) for r in lazy_rows)
    return {
        f"aim: lazy, training peak <= overhead + H + B + {_SLACK_CHUNKS} chunks + {_SLACK_MIB} "
        "MiB at every depth": all(r["within_aim"] for r in lazy_rows),
        "eager: the same": all(r["within_aim"] for r in eager_rows),
        "lazy: worst peak RSS over overhead + H + B (MiB)": worst,
        "lazy: the same in chunks": worst / lazy_rows[0]["chunk_MiB"],
        "lazy: training peak over overhead + H + B, per depth (MiB)": [round(e, 1) for e in excess],
        "lazy: growth of that excess from the shallowest to the deepest (MiB)": round(
            excess[-1] - excess[0], 1
        ),
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
        "no read-ahead: training peak over overhead + H + B, per depth (MiB)": [
            round(r["train_over_H_plus_B_MiB"], 1) for r in bare_rows
        ],
        "step seconds, default window / no read-ahead, paired in one process (per depth)": [
            round(p["ratio"], 3) for p in paired
        ],
        "the same, medians (s): window, none": [
            (round(p["window_s"], 2), round(p["none_s"], 2)) for p in paired
        ],
        "lazy: step seconds with the window / without, separate processes (per depth)": [
            round(a["step_s"] / n["step_s"], 3) for a, n in zip(lazy_rows, bare_rows, strict=True)
        ],
    }


_NOTES = [
    "Fixed overhead: the RSS just before the measured model is built, after a warm-up run of a "
    "one-layer model of the same width through the same code (see the module docstring); peaks "
    "are sampled every 2 ms on a thread (a shorter peak can be missed) and once more at the end "
    "of each phase.",
    "Setup (lazy) stays within H plus one chunk's materialized values (test_lazy_init counts "
    "them) and a few MiB of Python objects; eager init holds the whole fp32 model on the host "
    "first, as it must.",
    "Training: H covers the host payloads (at most H - W) and the disk pages read ahead of use "
    "(at most W, window_MiB; ahead_peak_MiB is the most held): a read-ahead is issued only "
    "while the window has room, forward and backward within the step, the optimizer for its "
    "current update set and up to two after it (colossal-chunk's [Note: read-ahead window]). "
    "B holds the accelerator's chunks and the step's non-model bytes (activations, gradients "
    "before they are copied into chunks), measured by the warmup. What is over H + B is what no "
    "budget counts: the C heap's slack (colossal-chunk's [Note: bounded host heap]: blocks of 32 "
    "KiB and more mapped on their own, a trim before the optimizer step), Python objects and "
    "per-chunk books, library pages first touched in training.",
    "'lazy, no read-ahead' (read_ahead_budget=0): every disk page is faulted in when used and "
    "all of H holds payloads, so its RSS is higher: pages faulted in are in no window. step_s "
    "is the median of steps 2 and 3 (step 1 traces the compute order), each method in its own "
    "process; the paired ratio steps both in one process, alternated (ABBA), medians of "
    f"{_PAIRED_STEPS - 1} steps each.",
    "Emulated accelerator: its budget B is host memory here, counted in RSS.",
    "Disk tier on the machine's disk; page cache that is not mapped is not RSS (dirty disk "
    "pages are bounded by the disk tier's write-behind window).",
    "Shared machine: 2 CPU cores, other jobs running (RSS does not depend on load; step time "
    "does).",
]


if __name__ == "__main__":  # one trial (or "paired"): method layers width B H dir -> JSON line
    method_arg, layers_arg, width_arg, b_arg, h_arg, dir_arg = sys.argv[1:7]
    sizes = int(layers_arg), int(width_arg)
    budgets = int(b_arg), int(h_arg)
    if method_arg == "paired":
        row = _paired(*sizes, *budgets, Path(dir_arg))
    else:
        row = _trial(*sizes, method_arg, *budgets, Path(dir_arg))
    print(json.dumps(row))
