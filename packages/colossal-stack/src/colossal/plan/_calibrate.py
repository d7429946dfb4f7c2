"""``colossal plan --calibrate``: measure the machine into a hardware profile (JSON) that
``plan --hardware-profile`` and ``colossal train --layout auto`` plan with.

[Note: hardware profile] A profile holds what was measured: matmul FLOP/s per dtype at the given
shape (computed as training computes them: a bf16 matmul on a CPU without bf16 kernels through
``Fp32Matmul``, ``matmul_mode`` "fp32"; see [Note: cpu matmul] in colossal_zero), memory-copy bytes/s, the all-reduce bus bytes/s and the latency of a one-element all-reduce over the launched
world (none in one process), the CPU cores this process may use (CPU ranks that outnumber
them share them: ``Hardware.oversubscribed``), disk write and read bytes/s (written with fsync, read after dropping the file's
cached pages), and the memory sizes seen. ``Hardware`` reads it with the measured matmul rate
as its peak (so plan with ``--efficiency 1`` or the fraction of it a whole step reaches). Every
rank of a run must plan from the same file, so a run never measures on its own: ranks measuring
apart could pick different layouts.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import torch
import torch.distributed as dist

from colossal_contracts import ConfigError
from colossal_zero import Precision

from ._hardware import Hardware

__all__ = ["calibrate", "load_profile", "profile_hardware"]

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_KEYS = ("flops", "copy_bw", "collective_bw", "disk_write_bw", "disk_read_bw", "memory")


def _timed(fn: Any, repeat: int, inner: int = 1) -> float:
    """Seconds per call of ``fn``: the median of ``repeat`` timings of ``inner`` calls each, so
    a burst of other work on a shared machine moves the figure less than a mean would."""
    fn()  # warm
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) / inner)
    return statistics.median(times)


def calibrate(
    *, tokens: int = 1024, hidden: int = 1024, disk_dir: Path | None = None, quick: bool = False
) -> dict[str, Any]:
    """Measure this machine (and, when torch.distributed is up, the world's all-reduce); see
    [Note: hardware profile]. ``tokens x hidden @ hidden x 4 hidden`` is the matmul shape."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    repeat = 3 if quick else 7
    flops, matmul_modes = {}, {}
    for name, dtype in _DTYPES.items():
        a = torch.randn(tokens, hidden, device=dev).to(dtype)
        b = torch.randn(hidden, 4 * hidden, device=dev).to(dtype)
        spec = Precision.parse(name)  # timed as training computes it ([Note: cpu matmul])
        matmul_modes[name] = spec.matmul_mode(dev)

        def mm(a: torch.Tensor = a, b: torch.Tensor = b, spec: Precision = spec) -> None:
            with spec.compute(dev):
                a @ b

        flops[name] = 2 * tokens * hidden * 4 * hidden / _timed(mm, repeat)
    n = (1 << 24) if not quick else (1 << 22)
    src, dst = torch.empty(n, device=dev), torch.empty(n, device=dev)
    copy_bw = 4 * n / _timed(lambda: dst.copy_(src), repeat)
    coll, latency = None, 0.0
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if world > 1:
        buf = torch.ones(n // 4, device=dev)
        secs = _timed(lambda: dist.all_reduce(buf), repeat)
        coll = 2 * (world - 1) / world * buf.numel() * 4 / secs  # bus bandwidth
        one = torch.ones(1, device=dev)
        # [Note: collective latency]: per step of the ring (world - 1 of them)
        latency = _timed(lambda: dist.all_reduce(one), repeat, 10) / (world - 1)
    write_bw, read_bw = _disk(disk_dir, (64 << 20) if not quick else (8 << 20))
    if dev == "cuda":
        memory = torch.cuda.get_device_properties(0).total_memory
    else:
        memory = psutil.virtual_memory().total // max(1, world)
    return {
        "device": torch.cuda.get_device_name(0) if dev == "cuda" else "cpu",
        "world": world,
        "matmul_shape": [tokens, hidden, 4 * hidden],
        "flops": flops,
        "matmul_mode": matmul_modes,
        "copy_bw": copy_bw,
        "collective_bw": coll,
        "collective_latency": latency,
        "disk_write_bw": write_bw,
        "disk_read_bw": read_bw,
        "memory": memory,
        "host_memory": psutil.virtual_memory().total,
        "cpu_cores": len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
        "disk": psutil.disk_usage(str(disk_dir or tempfile.gettempdir())).free,
    }


def _disk(folder: Path | None, size: int) -> tuple[float, float]:
    data = os.urandom(1 << 20) * (size >> 20)
    fd, name = tempfile.mkstemp(dir=folder, prefix="colossal-calibrate-")
    try:
        t0 = time.perf_counter()
        os.write(fd, data)
        os.fsync(fd)
        write_s = time.perf_counter() - t0
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.lseek(fd, 0, os.SEEK_SET)
        t0 = time.perf_counter()
        while os.read(fd, 1 << 22):
            pass
        read_s = time.perf_counter() - t0
    finally:
        os.close(fd)
        os.unlink(name)
    return size / write_s, size / read_s


def load_profile(path: Path) -> dict[str, Any]:
    """The profile at ``path``; one-line ``ConfigError`` when missing or not a profile."""
    try:
        prof = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(
            f"hardware profile {path} does not exist; write one with colossal plan --calibrate "
            f"--out {path}"
        ) from None
    except (OSError, ValueError) as err:
        raise ConfigError(
            f"hardware profile {path} is not readable JSON ({type(err).__name__}); write it again "
            "with colossal plan --calibrate"
        ) from None
    missing = [k for k in _KEYS if not isinstance(prof, dict) or k not in prof]
    bad = not missing and not all(
        isinstance(prof["flops"].get(d), (int, float)) and prof["flops"][d] > 0 for d in _DTYPES
    )
    if missing or bad:
        what = f"lacks {', '.join(missing)}" if missing else "has no positive flops per dtype"
        raise ConfigError(
            f"hardware profile {path} {what}; write it again with colossal plan --calibrate"
        )
    return prof


def profile_hardware(prof: dict[str, Any], *, precision: str, name: str) -> Hardware:
    """The ``Hardware`` a profile describes, its peak the measured matmul rate at
    ``precision`` (see [Note: hardware profile])."""
    link = prof["collective_bw"] or prof["copy_bw"]
    disk_bw = min(prof["disk_write_bw"], prof["disk_read_bw"])
    return Hardware(
        name,
        int(prof["memory"]),
        float(prof["flops"][precision]),
        max(1, int(prof.get("world", 1))),
        float(link),
        float(link),
        float(prof["copy_bw"]),
        int(prof.get("host_memory", prof["memory"])),
        int(prof.get("disk", 0)),
        float(disk_bw),
        2 * float(prof["copy_bw"]),  # a copy reads and writes each byte
        float(prof.get("collective_latency", 0.0)),  # absent from older profiles
        prof.get("device") == "cpu"
        and int(prof.get("world", 1)) > int(prof.get("cpu_cores") or 1e9),
    )
