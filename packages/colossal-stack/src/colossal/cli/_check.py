"""``colossal check``: what torch, devices, backends and memory this process sees."""

from __future__ import annotations

import importlib.metadata as md
import os
import platform

import psutil
import torch
import torch.distributed as dist
from rich.console import Console
from rich.table import Table

__all__ = ["environment_facts", "print_check"]

_PACKAGES = (
    "colossal-contracts",
    "colossal-memtrace",
    "colossal-chunk",
    "colossal-zero",
    "colossal-parallel",
    "colossal-models",
    "colossal-stack",
)


def _version(dist_name: str) -> str:
    try:
        return md.version(dist_name)
    except md.PackageNotFoundError:
        return "not installed"


def environment_facts() -> dict[str, str]:
    vm = psutil.virtual_memory()
    facts = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        **{name: _version(name) for name in _PACKAGES},
        "cpu cores (logical)": str(os.cpu_count()),
        "torch threads": str(torch.get_num_threads()),
        "host memory": f"{vm.total / 2**30:.1f} GiB total, {vm.available / 2**30:.1f} GiB available",
        "cuda": "available" if torch.cuda.is_available() else "not available",
    }
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            free, total = torch.cuda.mem_get_info(i)
            facts[f"cuda:{i}"] = (
                f"{torch.cuda.get_device_name(i)}, {total / 2**30:.1f} GiB, "
                f"{free / 2**30:.1f} GiB free"
            )
    else:
        facts["accelerator"] = "emulated: compute on the CPU, capacity a byte budget"
    backends = {
        "gloo": dist.is_gloo_available(),
        "nccl": dist.is_nccl_available(),
        "mpi": dist.is_mpi_available(),
    }
    facts["distributed backends"] = ", ".join(
        f"{k} {'yes' if v else 'no'}" for k, v in backends.items()
    )
    try:
        import pynvml  # noqa: F401

        facts["pynvml"] = (
            _version("nvidia-ml-py") if _version("nvidia-ml-py") != "not installed" else "installed"
        )
    except ImportError:
        facts["pynvml"] = "not installed (pip install 'colossal-stack[gpu]' for NVML probing)"
    return facts


def print_check(console: Console | None = None) -> int:
    table = Table(title="colossal check", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value")
    for k, v in environment_facts().items():
        table.add_row(k, v)
    (console or Console()).print(table)
    return 0
