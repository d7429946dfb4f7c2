"""Evaluate every layout, rank them, and find the fewest devices on which one fits."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from colossal_contracts import ConfigError

from ._cost import StepCost, step_cost
from ._gemini import gemini_bytes
from ._hardware import GiB, Hardware
from ._layout import Layout, enumerate_layouts
from ._memory import MemoryBreakdown, device_memory
from ._shape import ModelShape

__all__ = ["Plan", "PlanRequest", "evaluate", "fewest_devices", "plan_layouts"]


@dataclass(frozen=True)
class PlanRequest:
    """What to plan: a model on ``devices`` devices of ``hardware`` at a global batch and sequence
    length; ``efficiency`` is the fraction of peak FLOP/s a kernel reaches; ``precision`` is bf16
    (mixed) or fp32 training; ``only`` filters
    layouts (e.g. Megatron 1D + pipeline). ``buildable`` False also lists layouts the capability
    table refuses: a peer's (Megatron's bf16 without ZeRO), for comparisons only."""

    shape: ModelShape
    hardware: Hardware
    devices: int
    global_batch: int
    seq_len: int
    efficiency: float = 0.6
    precision: str = "bf16"
    only: Callable[[Layout], bool] | None = field(default=None, compare=False)
    buildable: bool = True


@dataclass(frozen=True)
class Plan:
    """One evaluated layout."""

    layout: Layout
    memory: MemoryBreakdown
    cost: StepCost
    fits: bool
    why: str = ""
    usage: float = 0.0  # the largest of needed / available over device, host and disk


def evaluate(req: PlanRequest, lay: Layout) -> Plan:
    """Memory and cost of one layout, and whether it fits device, host and disk."""
    hw = req.hardware
    per_node = min(hw.devices_per_node, lay.devices)
    mem = device_memory(
        req.shape, lay, req.seq_len, precision=req.precision, host_memory=hw.host_memory / per_node
    )
    chunks = 0
    if lay.method.startswith("gemini") and hw.collective_latency:
        chunks = gemini_bytes(req.shape, lay, req.precision, mem.activations).num_chunks
    cost = step_cost(
        req.shape, lay, mem, hw, req.seq_len, efficiency=req.efficiency, num_chunks=chunks
    )
    why = ""
    if mem.device_total > hw.memory:
        why = f"device {mem.device_total / GiB:.1f} GiB > {hw.memory / GiB:.1f} GiB"
    elif mem.host * per_node > hw.host_memory:
        why = f"host {mem.host * per_node / GiB:.0f} GiB > {hw.host_memory / GiB:.0f} GiB"
    elif mem.disk * per_node > hw.disk:
        why = f"disk {mem.disk * per_node / GiB:.0f} GiB > {hw.disk / GiB:.0f} GiB"
    usage = max(
        mem.device_total / hw.memory,
        mem.host * per_node / max(hw.host_memory, 1),
        mem.disk * per_node / max(hw.disk, 1) if mem.disk else 0.0,
    )
    return Plan(lay, mem, cost, not why, why, usage)


def plan_layouts(req: PlanRequest) -> list[Plan]:
    """Every layout on ``req.devices``, fitting ones first by step time, then the others by how
    far they are from fitting."""
    if req.devices < 1 or req.global_batch < 1 or req.seq_len < 1:
        raise ConfigError(
            f"devices, global batch and seq-len must be positive, got {req.devices}, "
            f"{req.global_batch}, {req.seq_len}"
        )
    lays: Iterable[Layout] = enumerate_layouts(
        req.devices,
        layers=req.shape.layers,
        heads=req.shape.heads,
        seq_len=req.seq_len,
        global_batch=req.global_batch,
        precision=req.precision if req.buildable else None,
    )
    plans = [evaluate(req, lay) for lay in lays if req.only is None or req.only(lay)]
    return sorted(
        plans, key=lambda p: (not p.fits, p.cost.step if p.fits else p.usage, p.memory.device_total)
    )


def fewest_devices(req: PlanRequest, candidates: Iterable[int]) -> tuple[int, Plan] | None:
    """The smallest device count among ``candidates`` (ascending) with a fitting layout, and the
    fastest such layout; ``None`` when none fits."""
    for n in candidates:
        plans = plan_layouts(PlanRequest(**{**req.__dict__, "devices": n}))
        if plans and plans[0].fits:
            return n, plans[0]
    return None
