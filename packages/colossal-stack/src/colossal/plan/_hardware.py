"""Hardware presets and the parsing of sizes (``80GiB``) and bandwidths (``300GB/s``).

A ``Hardware`` is one kind of device in nodes of ``devices_per_node``; the figures are the vendors'
dense 16-bit tensor peaks and the usual link speeds per direction (see docs/plan.md).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from colossal_contracts import ConfigError

from .._sizes import parse_bytes as _parse_size

__all__ = ["HARDWARE", "Hardware", "parse_bandwidth", "parse_bytes"]

GiB = 1 << 30


def parse_bytes(text: str, *, what: str = "size") -> int:
    """``"80GiB"`` -> bytes (the stack's one size parser); ``ConfigError`` naming ``what``."""
    size = _parse_size(text, what=what)
    if size is None:  # only None gives None
        raise ConfigError(f"{what} is missing; write e.g. 80GiB, 1TiB or 512MB")
    return size


def parse_bandwidth(text: str, *, what: str = "bandwidth") -> float:
    """``"300GB/s"`` -> bytes per second."""
    if not text.lower().endswith("/s"):
        raise ConfigError(f"{what} {text!r} is not a bandwidth; write e.g. 300GB/s or 25GB/s")
    return float(parse_bytes(text[:-2], what=what))


@dataclass(frozen=True)
class Hardware:
    """One kind of device and its links.

    Attributes:
        name: preset name.
        memory: bytes of device memory.
        peak_flops: dense 16-bit tensor FLOP/s of one device.
        devices_per_node: devices that share the fast intra-node link.
        intra_bw: bytes/s per direction between devices of a node.
        inter_bw: bytes/s per direction per device between nodes.
        pcie_bw: bytes/s per direction between a device and its host.
        host_memory: bytes of host memory per node.
        disk: bytes of NVMe per node; ``disk_bw`` its bytes/s (read or write).
        mem_bw: bytes/s of device memory traffic (reads plus writes), for the steps that are
            bound by it (elementwise ops over activations, the optimizer); 0: not modelled.
        collective_latency: seconds a collective costs beside its bytes per other rank of its
            group (a ``g``-rank one costs ``g - 1`` times it, [Note: collective latency]); 0:
            not modelled.
        oversubscribed: the devices are CPU ranks that outnumber the cores: a rank waiting in a
            pipeline bubble hands its core to the others, so the bubble costs no step time.
    """

    name: str
    memory: int
    peak_flops: float
    devices_per_node: int
    intra_bw: float
    inter_bw: float
    pcie_bw: float
    host_memory: int
    disk: int = 0
    disk_bw: float = 3e9
    mem_bw: float = 0.0
    collective_latency: float = 0.0
    oversubscribed: bool = False

    def with_(self, **changes: Any) -> Hardware:
        """A copy with fields replaced (CLI overrides)."""
        return replace(self, **changes)


HARDWARE: dict[str, Hardware] = {
    # Consumer cards: one per machine, PCIe only; fp16 tensor peak with fp32 accumulation.
    "rtx2060-6g": Hardware(
        "rtx2060-6g", 6 * GiB, 26e12, 1, 12e9, 12e9, 12e9, 32 * GiB, mem_bw=336e9
    ),
    "rtx3090-24g": Hardware(
        "rtx3090-24g", 24 * GiB, 71e12, 1, 25e9, 25e9, 25e9, 64 * GiB, mem_bw=936e9
    ),
    # Data-centre nodes of 8 (SXM, NVLink per direction, 200 Gb/s InfiniBand per device).
    # mem_bw: the vendors' HBM/GDDR bandwidth
    "a100-80g": Hardware(
        "a100-80g", 80 * GiB, 312e12, 8, 300e9, 25e9, 25e9, 1024 * GiB, mem_bw=2.04e12
    ),
    "h100-80g": Hardware(
        "h100-80g", 80 * GiB, 989e12, 8, 450e9, 50e9, 50e9, 2048 * GiB, mem_bw=3.35e12
    ),
    "h200-141g": Hardware(
        "h200-141g", 141 * 10**9, 989e12, 8, 450e9, 50e9, 50e9, 2048 * GiB, mem_bw=4.8e12
    ),
}
