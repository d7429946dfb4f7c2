"""One ``colossal train`` job of ``bench_box_capacity``, run as the command in its own process:
the GPT it trains (a GPT-2 ``config.json`` of a given depth and width, trained as itself through
``--model hf:PATH``, built lazily from the config on the meta device), and what the job did: its
step records (``metrics.jsonl``), its peak RSS (the kernel's high-water mark, ``VmHWM``, which
counts the disk tier's file pages mapped into the process), its peak anonymous memory (``RssAnon``
+ ``RssShmem``, sampled every 0.2 s: what the process itself holds, the file pages left out), its
storage I/O (``/proc/<pid>/io``) and how it ended.

``stop_after``: the job is killed once that many step records are written, before its final save:
a run whose disk tier fills the free disk has no room for a checkpoint as large again (the
capacity trials); checkpoint runs let the job save and exit on its own.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

MiB = 2**20


def gpt2_config(path: Path, *, layers: int, width: int, seq_len: int, vocab: int = 256) -> Path:
    """Write a GPT-2 ``config.json`` of ``layers`` blocks of ``width`` (heads of 64 dims) with
    ``seq_len`` positions and ``vocab`` tokens (the bytes tokenizer's 256); return its path."""
    cfg = {
        "model_type": "gpt2",
        "n_layer": layers,
        "n_embd": width,
        "n_head": max(1, width // 64),
        "n_positions": seq_len,
        "vocab_size": vocab,
        "bos_token_id": 0,
        "eos_token_id": 0,
        "tie_word_embeddings": True,
    }
    path.mkdir(parents=True, exist_ok=True)
    out = path / f"gpt2-{layers}x{width}.json"
    out.write_text(json.dumps(cfg))
    return out


def gpt2_params(layers: int, width: int, seq_len: int, vocab: int = 256) -> int:
    """Parameters of ``gpt2_config``'s model (tied embeddings): each block's 12 w^2 + 13 w, the
    token and position embeddings, the final norm."""
    return layers * (12 * width * width + 13 * width) + (vocab + seq_len) * width + 2 * width


@dataclass
class Job:
    """What one ``colossal train`` process did.

    Attributes:
        ok: the job wrote ``steps`` step records with finite losses (and, without
            ``stop_after``, exited 0).
        records: its ``metrics.jsonl`` records, one per step.
        peak_rss: the process's RSS high-water mark (bytes; VmHWM, read before it ended).
        peak_anon: the most anonymous + shared memory seen (bytes; RssAnon + RssShmem, sampled
            every 0.2 s, so a peak shorter than that can be missed).
        io_read, io_written: storage bytes the process read and wrote (``/proc/<pid>/io``).
        wall_s: seconds from the start of the command to its end.
        why: the last lines of its output when it failed ("" when ok).
    """

    ok: bool
    records: list[dict] = field(default_factory=list)
    peak_rss: int = 0
    peak_anon: int = 0
    io_read: int = 0
    io_written: int = 0
    wall_s: float = 0.0
    why: str = ""


def _proc(pid: int) -> tuple[int, int, int, int]:
    """(VmHWM bytes, RssAnon + RssShmem bytes now, read_bytes, write_bytes) of ``pid``; zeros
    where unreadable."""
    hwm = anon = rb = wb = 0
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                hwm = int(line.split()[1]) * 1024
            elif line.startswith(("RssAnon:", "RssShmem:")):
                anon += int(line.split()[1]) * 1024
        for line in Path(f"/proc/{pid}/io").read_text().splitlines():
            key, _, val = line.partition(":")
            if key == "read_bytes":
                rb = int(val)
            elif key == "write_bytes":
                wb = int(val)
    except (OSError, ValueError):
        pass
    return hwm, anon, rb, wb


def _records(metrics: Path) -> list[dict]:
    if not metrics.exists():
        return []
    out = []
    for line in metrics.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:  # a line being written
            break
    return out


def train(
    args: list[str], out: Path, *, steps: int, stop_after: bool, timeout_s: float, log: Path
) -> Job:
    """Run ``colossal train ARGS --steps STEPS --out OUT`` (the installed command; ``python -m colossal`` where it is not on PATH) and
    measure it; see the module docstring for ``stop_after``."""
    exe = shutil.which("colossal")
    cmd = [exe] if exe else [sys.executable, "-m", "colossal"]
    cmd += ["train", *args, "--steps", str(steps)]
    cmd += ["--out", str(out)]
    t0 = time.perf_counter()
    with log.open("w") as sink:
        p = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
        hwm = anon = rb = wb = 0
        done = False
        while p.poll() is None:
            time.sleep(0.2)
            got = _proc(p.pid)
            if got[0]:
                hwm, rb, wb = got[0], got[2], got[3]
                anon = max(anon, got[1])
            recs = _records(out / "metrics.jsonl")
            if stop_after and len(recs) >= steps:  # trained: stop before the final save
                last = _proc(p.pid)
                if last[0]:
                    hwm, rb, wb = last[0], last[2], last[3]
                    anon = max(anon, last[1])
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
                done = True
                break
            if time.perf_counter() - t0 > timeout_s:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
                break
    wall = time.perf_counter() - t0
    recs = _records(out / "metrics.jsonl")
    finite = all(r["loss"] == r["loss"] and abs(r["loss"]) < float("inf") for r in recs)
    ok = len(recs) >= steps and finite and (done or p.returncode == 0)
    why = ""
    if not ok:
        tail = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
        errors = [ln for ln in tail if ln.startswith(("error:", "Traceback", "RuntimeError"))]
        why = (errors[-1] if errors else " | ".join(tail[-2:]))[-600:] or f"exit {p.returncode}"
        if time.perf_counter() - t0 > timeout_s:
            why = f"timed out after {timeout_s:.0f} s; {why}"
    return Job(ok, recs, hwm, anon, rb, wb, wall, why)


def disk_rates(records: list[dict], skip_first: bool = True) -> dict[str, float]:
    """Per step (the first step left out when there are others: it includes the warmup) and
    per second, the tier's disk bytes from the step records: read ahead + faulted in, written
    behind, and the seconds with disk I/O in flight."""
    recs = records[1:] if skip_first and len(records) > 1 else records
    n = max(1, len(recs))

    def total(key: str) -> float:
        return float(sum(r.get(key, 0) or 0 for r in recs))

    read = total("disk_read_bytes") + total("disk_faulted_bytes")
    written = total("disk_written_bytes")
    busy = total("disk_busy_s")
    return {
        "step_s": total("step_time_s") / n,
        "disk_read_MiB_per_step": read / n / MiB,
        "disk_written_MiB_per_step": written / n / MiB,
        "tier_read_MiB_s": total("disk_read_bytes") / total("disk_read_s") / MiB
        if total("disk_read_s")
        else float("nan"),
        "tier_write_MiB_s": written / total("disk_write_s") / MiB
        if total("disk_write_s")
        else float("nan"),
        "tier_MiB_s": (read + written) / busy / MiB if busy else float("nan"),
        "step_read_MiB_s": read / max(total("step_time_s"), 1e-9) / MiB,
        "step_write_MiB_s": written / max(total("step_time_s"), 1e-9) / MiB,
    }


def peaks(records: list[dict]) -> dict[str, float]:
    """The tiers' peaks over the run (MiB): emulated accelerator, host, disk."""
    return {
        k + "_MiB": max((r.get(k + "_bytes", 0) or 0) for r in records) / MiB if records else 0.0
        for k in ("accelerator_peak", "host_peak", "disk_peak")
    }


def dir_bytes(path: Path) -> int:
    """Bytes of the files under ``path`` (0 when it does not exist)."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0
