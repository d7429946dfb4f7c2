"""``colossal plan``'s side of ``bench_box_capacity``: the planner (``colossal.plan``, what the
command runs) asked about this machine, measured once by ``--calibrate``, with its device memory
the run's accelerator budget and its host memory and disk the run's host and disk budgets; and
its answers for the GPUs of Colossal-AI's claims (its hardware presets).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from _box_capacity_job import gpt2_config, gpt2_params

from colossal.plan import HARDWARE, PlanRequest, model_shape, plan_layouts
from colossal.plan._calibrate import calibrate, profile_hardware
from colossal.plan._hardware import Hardware

GiB = 2**30


def box_hardware(
    *,
    width: int,
    seq_len: int,
    accelerator: int,
    host: int,
    disk: int,
    disk_dir: Path,
    quick: bool,
) -> tuple[Hardware, dict[str, Any]]:
    """This machine as ``colossal plan --calibrate`` measures it (matmuls of ``seq_len`` tokens
    at ``width``, memory copies, the disk under ``disk_dir``), its memory and disk set to the
    run's budgets; and the profile (``quick``: ``--calibrate``'s small sizes)."""
    prof = calibrate(tokens=seq_len, hidden=width, disk_dir=disk_dir, quick=quick)
    hw = profile_hardware(prof, precision="bf16", name="this machine (calibrated)")
    return replace(hw, memory=accelerator, host_memory=host, disk=disk), prof


def bf16_rate(tokens: int, width: int) -> float:
    """FLOP/s of one bf16 ``tokens x width @ width x width`` matmul on this machine's CPU (one
    warm-up call on a tenth of the rows first): the full run's block matmuls, for its estimate.
    Computed as ``colossal train`` computes them (through ``Fp32Matmul`` on a CPU without bf16
    kernels, or as ``COLOSSAL_CPU_MATMUL`` says)."""
    import time

    import torch

    from colossal_zero import Precision

    bf16 = Precision.parse("bf16")
    b = torch.randn(width, width).to(torch.bfloat16)
    with bf16.compute("cpu"):
        torch.randn(max(1, tokens // 10), width).to(torch.bfloat16) @ b
    a = torch.randn(tokens, width).to(torch.bfloat16)
    with bf16.compute("cpu"):
        t0 = time.perf_counter()
        a @ b
        secs = time.perf_counter() - t0
    return 2 * tokens * width * width / secs


def best_gemini(hw: Hardware, config: Path, *, seq_len: int) -> Any:
    """The planner's fastest fitting Gemini layout of ``config`` on one device at batch 1
    (``None`` when none fits): the run ``colossal train`` makes with tier budgets."""
    shape = model_shape(f"hf:{config}", "")
    req = PlanRequest(
        shape,
        hw,
        1,
        1,
        seq_len,
        precision="bf16",
        only=lambda lay: lay.method.startswith("gemini"),
    )
    plans = [p for p in plan_layouts(req) if p.fits]
    return plans[0] if plans else None


_LIBRARIES = "import torch, transformers, colossal, colossal_zero, colossal_chunk"


def process_baseline() -> int:
    """Resident bytes of a fresh Python process with the job's libraries loaded (torch,
    transformers, colossal): what a ``colossal train`` process holds before its model, which the
    planner's per-device bytes leave out. Measured in a child process."""
    code = (
        f"{_LIBRARIES}\n"
        "print([int(ln.split()[1]) * 1024 for ln in open('/proc/self/status') "
        "if ln.startswith('VmRSS:')][0])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(out.stdout.strip().splitlines()[-1])


def prediction(plan: Any, baseline: int = 0) -> dict[str, float]:
    """What a plan predicts of a run: device (the emulated accelerator), host and disk bytes,
    the model's memory (device + host: the emulated accelerator is host RAM too), that plus
    ``baseline`` (the process's own, ``process_baseline``), and seconds per step."""
    m = plan.memory
    return {
        "layout": plan.layout.describe(),
        "device": float(m.device_total),
        "host": float(m.host),
        "disk": float(m.disk),
        "model_memory": float(m.device_total + m.host),
        "memory": float(m.device_total + m.host + baseline),
        "step_s": float(plan.cost.step),
    }


def largest_depth(
    hw: Hardware, *, width: int, seq_len: int, scratch: Path, most: int = 4096
) -> int:
    """The deepest GPT-2 of ``width`` for which the planner finds a fitting Gemini layout on
    ``hw`` (0 when none): a bisection, fitting being monotone in depth."""
    lo, hi = 0, most
    while lo < hi:
        mid = (lo + hi + 1) // 2
        cfg = gpt2_config(scratch, layers=mid, width=width, seq_len=seq_len)
        if best_gemini(hw, cfg, seq_len=seq_len) is not None:
            lo = mid
        else:
            hi = mid - 1
    return lo


def claim(hardware: str, host: int, *, width: int, seq_len: int, scratch: Path) -> dict[str, Any]:
    """The planner's largest GPT-2 of ``width`` on one ``hardware`` preset GPU with ``host``
    bytes of host memory (no disk) at batch 1 x ``seq_len``: params and layout."""
    hw = replace(HARDWARE[hardware], host_memory=host, disk=0)
    depth = largest_depth(hw, width=width, seq_len=seq_len, scratch=scratch, most=1024)
    if depth == 0:
        return {"hardware": hardware, "params": 0, "layout": "-"}
    cfg = gpt2_config(scratch, layers=depth, width=width, seq_len=seq_len)
    plan = best_gemini(hw, cfg, seq_len=seq_len)
    return {
        "hardware": hardware,
        "host_GiB": host / GiB,
        "depth": depth,
        "width": width,
        "params": gpt2_params(depth, width, seq_len),
        "layout": plan.layout.describe(),
        "step_s": plan.cost.step,
        "plan": json.dumps(prediction(plan)),
    }
