"""The Gemini trial of ``bench_capacity_disk``: a checkpointed GPT trained a warmup step and 3
measured steps under budgets B, H and D with a disk tier, and the figures it reached (tier
peaks, disk bytes and throughput per step, where its read-aheads spent their time)."""

from __future__ import annotations

import gc
import statistics
import time
from pathlib import Path

import psutil
import torch
from bench_capacity import _cfg

from colossal_chunk.disk._store import ReadRecord
from colossal_contracts import CapacityError, ConfigError, TierName
from colossal_memtrace import MomentRecorder, estimate_step
from colossal_models import GPT, apply_activation_checkpointing
from colossal_zero import GeminiConfig, GeminiOptimizer, apply_gemini

MiB = 2**20
STEPS = 3
SEQ = 8  # tokens per step: few, as before checkpointing, so the plain PyTorch row (which does not
# checkpoint) stays comparable with the earlier runs; Gemini's blocks are checkpointed


def _inputs(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (2, 1, SEQ), generator=g)
    return x[0].to(device), x[1].to(device)


def _non_model(cfg) -> int:  # type: ignore[no-untyped-def]
    """The warmup step's reserve for non-model bytes (the per-moment measurement replaces it):
    the live-tensor estimate's peak non-model bytes of the checkpointed GPT's AdamW step."""

    def build() -> GPT:
        model = GPT(cfg)
        apply_activation_checkpointing(model)
        return model

    stats = estimate_step(build, _inputs, build_optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-3))
    return stats.peak_non_model("accelerator")


def _io() -> tuple[int, int]:
    c = psutil.Process().io_counters()
    return c.read_bytes, c.write_bytes


def _gemini_disk_fits(depth: int, width: int, b: int, h: int, d: int, where: Path) -> dict | None:
    """Train a warmup step and 3 measured steps; the figures, or None when it does not fit."""
    cfg = _cfg(depth, width)
    non_model = _non_model(cfg)
    gc.collect()
    torch.manual_seed(0)
    model = GPT(cfg)
    apply_activation_checkpointing(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gcfg = GeminiConfig(
        precision="fp32",
        placement="auto",
        non_model_bytes=non_model,
        accelerator_bytes=b,
        host_bytes=h,
        disk_bytes=d,
        disk_dir=where / f"chunks-{depth}x{width}",
        device="cpu",
    )
    recorder = MomentRecorder("cpu")
    gm = None
    try:
        gm = apply_gemini(model, gcfg, group=None, recorder=recorder)
        del model
        gopt = GeminiOptimizer.from_torch(gm, opt)
        x, y = _inputs(torch.device("cpu"))
        losses, rss = [], []
        first = gm.memory_stats()
        io0, t0, dev0 = first.disk_io, time.perf_counter(), _io()
        unwritten0 = first.disk_unwritten_bytes
        for i in range(STEPS + 1):  # step 0 is the warmup (traced); 1..3 are measured
            if i == 1:
                st = gm.memory_stats()
                io0, t0, dev0 = st.disk_io, time.perf_counter(), _io()
                unwritten0 = st.disk_unwritten_bytes
                gm.runtime.manager.books.reset_stats()
                store = gm.runtime.manager.books.tiers[TierName.DISK].store
                store.record_reads()  # type: ignore[union-attr]  # from here on
            loss = gm(x, y)
            gopt.backward(loss)
            gopt.step()
            gopt.zero_grad()
            losses.append(loss.item())
            rss.append(psutil.Process().memory_info().rss)
        dt = (time.perf_counter() - t0) / STEPS
        dev1 = _io()
        reads = store.record_reads()  # type: ignore[union-attr]
        stats = gm.memory_stats()
    except (CapacityError, ConfigError) as exc:
        recorder.close()
        print(f"  {depth}x{width}: does not fit ({str(exc)[:120]})")
        return None
    finally:
        if gm is not None:
            gm.runtime.manager.close()
    io = stats.disk_io - io0  # type: ignore[operator]
    tiers = stats.tiers
    assert tiers["accelerator"].peak_bytes <= b and tiers["host"].peak_bytes <= h
    assert tiers["disk"].peak_bytes <= d
    if not all(v == v for v in losses):
        return None
    return {
        "params": cfg.num_params(),
        "acc_peak_MiB": tiers["accelerator"].peak_bytes / MiB,
        "host_peak_MiB": tiers["host"].peak_bytes / MiB,
        "disk_peak_MiB": tiers["disk"].peak_bytes / MiB,
        "disk_read_MiB_per_step": io.bytes_read / STEPS / MiB,
        "disk_written_MiB_per_step": io.bytes_written / STEPS / MiB,
        # moved back to disk without a write (colossal-chunk's [Note: disk copies])
        "disk_unwritten_MiB_per_step": (stats.disk_unwritten_bytes - unwritten0) / STEPS / MiB,
        "device_read_MiB_per_step": (dev1[0] - dev0[0]) / STEPS / MiB,
        "device_written_MiB_per_step": (dev1[1] - dev0[1]) / STEPS / MiB,
        "tier_read_MiB_s": io.bytes_read / io.read_s / MiB if io.read_s else float("nan"),
        "tier_write_MiB_s": io.bytes_written / io.write_s / MiB if io.write_s else float("nan"),
        # either kind in flight, each second once (colossal-chunk's [Note: busy time])
        "disk_busy_s_per_step": io.busy_s / STEPS,
        "tier_MiB_s": (io.bytes_read + io.bytes_written) / io.busy_s / MiB
        if io.busy_s
        else float("nan"),
        "moved_MiB_per_step": stats.bytes_moved / STEPS / MiB,
        "read_profile": _read_profile(reads, STEPS),
        "payload_bytes": max(c.shard_bytes for c in gm.runtime.manager.chunks.values()),
        "step_s": dt,
        "rss_peak_MiB": max(rss) / MiB,
    }


def _union(spans: list[tuple[float, float]]) -> float:
    """Seconds covered by at least one of ``spans``."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def _read_profile(reads: list[ReadRecord], steps: int) -> dict[str, object]:
    """Where the measured steps' read-aheads spent their in-flight time."""
    if not reads:
        return {}

    def ms(xs: list[float]) -> float:
        return round(1e3 * statistics.median(xs), 2)

    flight = _union([(r.issued, r.ended) for r in reads])
    return {
        "reads per step": len(reads) // steps,
        "read size (bytes)": max(r.nbytes for r in reads),
        "issue to reader start (median ms)": ms([r.started - r.issued for r in reads]),
        "reader start to mapped (median ms)": ms([r.ended - r.started for r in reads]),
        "share of reads already in the page cache when the reader started": round(
            sum(r.cached for r in reads) / len(reads), 3
        ),
        "share of in-flight seconds with no read job running": round(
            1 - _union([(r.started, r.ended) for r in reads]) / flight, 3
        ),
    }
