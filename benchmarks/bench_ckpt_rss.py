"""Peak RSS while a Gemini model with ~1 GiB of states (fp32 parameters + both Adam moments)
saves its sharded checkpoint, exports the consolidated model and loads the checkpoint back, per
chunk size; streamed (this repository's ``save_sharded``, ``export_gemini``, ``load_sharded``)
against the in-memory way they worked before (a dict of clones of the rank's shard through
``safetensors.save_file``; ``full_state_dict`` through ``save_file``), measured in the same run.

Each trial is a fresh process: GPT built, Gemini applied with the chunk size, one training step
(so the Adam moments exist), then save, export and load, each under a thread sampling the
process's RSS every 2 ms (psutil). The figure is the peak during the phase minus the RSS just
before it. Aim (issue 14): save <= 2 chunks + 64 MiB. RSS counts file pages mapped into the
process (``safe_open`` maps the file it reads, the disk tier maps its chunk files); the
anonymous part (RSS minus shared) is reported beside it.
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
from safetensors.torch import save_file

from colossal.booster import export_gemini
from colossal_chunk import trim_host_heap
from colossal_models import GPT, GPTConfig
from colossal_zero import GeminiConfig, GeminiOptimizer, apply_gemini, load_sharded, save_sharded

from _report import Report

MiB = 2**20
_COLUMNS = [
    "method",
    "tier",
    "params",
    "states_MiB",
    "chunk_MiB",
    "save_s",
    "save_rss_MiB",
    "save_anon_MiB",
    "save_chunks_plus_64",
    "export_rss_MiB",
    "export_anon_MiB",
    "load_rss_MiB",
    "load_anon_MiB",
]


class _PeakRss:
    """The highest RSS (and RSS minus shared file pages) of this process while the block runs,
    minus the values just before it; sampled on a thread every 2 ms."""

    def __init__(self) -> None:
        self.proc, self._stop = psutil.Process(), threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self.rss = self.anon = 0

    def _sample(self) -> None:
        m = self.proc.memory_info()
        self.rss, self.anon = max(self.rss, m.rss), max(self.anon, m.rss - m.shared)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            time.sleep(0.002)

    def __enter__(self) -> _PeakRss:
        gc.collect()
        trim_host_heap()
        m = self.proc.memory_info()
        self.base_rss, self.base_anon = m.rss, m.rss - m.shared
        self.rss, self.anon = self.base_rss, self.base_anon
        self.t0 = time.perf_counter()
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()
        self._sample()
        self.seconds = time.perf_counter() - self.t0

    @property
    def over(self) -> tuple[float, float]:
        return (self.rss - self.base_rss) / MiB, (self.anon - self.base_anon) / MiB


def _old_save(gm, opt, directory: Path) -> None:  # type: ignore[no-untyped-def]
    """The save this repository had before streaming: clones of the shard in one dict, then
    ``save_file`` (which serializes the whole dict to bytes in memory before writing)."""
    m = gm.runtime.manager
    tensors = {}
    for c in m.registry.param_chunks():
        fp32 = gm.runtime.roles.fp32(c)
        for name in c.records:
            part = fp32.shard_view(name)
            if part is None:
                continue
            tensors[f"param/{name}"] = part[0].float().cpu().clone()
            for kind in ("exp_avg", "exp_avg_sq"):
                tensors[f"{kind}/{name}"] = (
                    m.registry.parallel_chunk(kind, c).shard_view(name)[0].clone()
                )
    save_file(tensors, str(directory / "old-shard.safetensors"))


def _old_export(gm, directory: Path) -> None:  # type: ignore[no-untyped-def]
    full = gm.full_state_dict()
    seen: set[int] = set()
    for k, v in list(full.items()):  # untie, as the old write_full_model did
        if v.untyped_storage().data_ptr() in seen:
            full[k] = v.clone()
        seen.add(v.untyped_storage().data_ptr())
    save_file(full, str(directory / "model.safetensors"))


def _trial(method: str, width: int, layers: int, chunk_numel: int, tier: str, where: Path) -> dict:
    cfg = GPTConfig(
        vocab_size=256, max_seq_len=16, num_layers=layers, num_heads=8, hidden_size=width
    )
    torch.manual_seed(0)
    model = GPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    disk = tier == "disk"
    gcfg = GeminiConfig(
        chunk_numel=chunk_numel,
        host_bytes=2 * chunk_numel * 4 if disk else None,  # states spill to files
        disk_bytes=None if disk else 0,
        disk_dir=where / "tier" if disk else None,
    )
    if disk:
        (where / "tier").mkdir(exist_ok=True)
    gm = apply_gemini(model, gcfg, group=None)
    gopt = GeminiOptimizer.from_torch(gm, opt)
    del model, opt
    x = torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(0))
    gopt.backward(gm(x, x))
    gopt.step()
    gopt.zero_grad()
    ckpt, exp = where / "ckpt", where / "export"
    ckpt.mkdir()
    exp.mkdir()
    with _PeakRss() as save:
        if method == "streamed":
            save_sharded(gm, gopt, ckpt)
        else:
            _old_save(gm, gopt, ckpt)
    with _PeakRss() as export:
        if method == "streamed":
            export_gemini(gm, exp, max_shard_bytes=256 * MiB)
        else:
            _old_export(gm, exp)
    load_rss = load_anon = float("nan")
    if method == "streamed":
        with _PeakRss() as load:
            load_sharded(gm, gopt, ckpt)
        load_rss, load_anon = load.over
    chunk = chunk_numel * 4
    n = cfg.num_params()
    gm.runtime.manager.close()
    save_rss, save_anon = save.over
    return {
        "method": method,
        "tier": tier,
        "params": n,
        "states_MiB": n * 12 / MiB,
        "chunk_MiB": chunk / MiB,
        "save_s": save.seconds,
        "save_rss_MiB": save_rss,
        "save_anon_MiB": save_anon,
        "save_chunks_plus_64": (2 * chunk + 64 * MiB) / MiB,
        "export_rss_MiB": export.over[0],
        "export_anon_MiB": export.over[1],
        "load_rss_MiB": load_rss,
        "load_anon_MiB": load_anon,
    }


def run(quick: bool, out_dir: Path) -> Report:
    width, layers = (384, 6) if quick else (768, 12)  # 10.7M / 85.1M params
    chunks = (1 << 20, 4 << 20) if quick else (4 << 20, 16 << 20, 64 << 20)
    trials = [("streamed", c, "host") for c in chunks]
    trials += [("streamed", chunks[0], "disk"), ("in-memory (before)", chunks[-1], "host")]
    n = GPTConfig(vocab_size=256, num_layers=layers, num_heads=8, hidden_size=width).num_params()
    report = Report(
        name="ckpt_rss",
        title=f"Peak RSS increase while a Gemini GPT ({n / 1e6:.1f}M params, "
        f"{n * 12 / 2**30:.2f} GiB of fp32 params + Adam moments) saves, exports and loads, per "
        "chunk size: streamed vs in-memory",
        columns=_COLUMNS,
    )
    for method, chunk, tier in trials:
        where = Path(tempfile.mkdtemp(prefix="bench-ckpt-"))
        try:
            argv = [sys.executable, __file__, method, str(width), str(layers), str(chunk), tier]
            argv.append(str(where))
            out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
            report.rows.append(json.loads(out.strip().splitlines()[-1]))
        finally:
            shutil.rmtree(where, ignore_errors=True)
    streamed = [r for r in report.rows if r["method"] == "streamed"]
    old = [r for r in report.rows if r["method"] != "streamed"]
    report.summary = {
        "streamed save: worst RSS increase (MiB)": max(r["save_rss_MiB"] for r in streamed),
        "streamed save within 2 chunks + 64 MiB (every row)": all(
            r["save_rss_MiB"] <= r["save_chunks_plus_64"] for r in streamed
        ),
        "streamed export: worst RSS increase (MiB)": max(r["export_rss_MiB"] for r in streamed),
        "streamed load: worst anonymous increase (MiB)": max(r["load_anon_MiB"] for r in streamed),
        "in-memory save / export RSS increase (MiB)": [
            (round(r["save_rss_MiB"]), round(r["export_rss_MiB"])) for r in old
        ],
    }
    report.notes = [
        "One process, no process group (dp = 1: the rank's shard is the whole model); fp32 "
        "training, emulated accelerator without a budget, so every chunk lives in host memory "
        "('host') or, with a host budget of two chunks, spills its states to the disk tier "
        "('disk', files on this machine's disk).",
        "RSS is sampled every 2 ms on a thread (a shorter peak can be missed) and once more at "
        "the end of each phase; each phase starts after gc and malloc_trim. 'anon' is RSS "
        "minus shared (file-backed) pages: the disk tier maps its chunk files, whose pages "
        "count in RSS while mapped but are page cache, not the process's memory (save lets "
        "each chunk's pages go after writing it). Load preads into the shards: no file mapped.",
        "The in-memory row is the code this repository had before (reimplemented here): a "
        "dict of clones of the shard through safetensors' save_file, and full_state_dict (a "
        "clone of every fp32 parameter) through save_file.",
        "Written bytes go to the page cache (not RSS); save fsyncs its file. The export writes "
        "shards of at most 256 MiB.",
        "Shared machine: 2 CPU cores, other jobs running (RSS does not depend on "
        "load; seconds do).",
    ]
    return report


if __name__ == "__main__":  # one trial: method width layers chunk_numel tier dir -> JSON line
    m_arg, w_arg, l_arg, c_arg, t_arg, d_arg = sys.argv[1:7]
    row = _trial(m_arg, int(w_arg), int(l_arg), int(c_arg), t_arg, Path(d_arg))
    print(json.dumps(row))
