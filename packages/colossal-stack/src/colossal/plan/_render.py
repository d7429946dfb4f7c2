"""The ranked table (rich), the JSON form, and a PNG of the memory split of the top layouts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from ._hardware import GiB
from ._search import Plan

__all__ = ["plan_json", "plot_memory", "print_plans"]

_KINDS = ("params", "grads", "optimizer", "activations", "buffers")


def plan_json(plan: Plan) -> dict[str, Any]:
    """One plan as plain JSON types."""
    lay = plan.layout
    return {
        "layout": lay.describe(),
        **{k: getattr(lay, k) for k in lay.__dataclass_fields__},
        "memory_bytes": plan.memory.as_dict(),
        "fits": plan.fits,
        "why_not": plan.why,
        "step_s": plan.cost.step,
        "mfu": plan.cost.mfu,
        "bubble": plan.cost.bubble,
        "cost_s": {k: getattr(plan.cost, k) for k in plan.cost.__dataclass_fields__},
    }


def print_plans(plans: list[Plan], title: str, top: int, console: Console | None = None) -> None:
    """The ``top`` plans as a rich table, GiB per device by kind at the peak."""
    t = Table(title=title)
    for col in ("#", "layout", *_KINDS, "total", "host", "fits", "step s", "MFU"):
        t.add_column(col, justify="left" if col == "layout" else "right", no_wrap=True)
    for i, p in enumerate(plans[:top], 1):
        m = p.memory
        split = m.at_peak()
        t.add_row(
            str(i),
            p.layout.describe(),
            *(f"{split[k] / GiB:.1f}" for k in _KINDS),
            f"{m.device_total / GiB:.1f}",
            f"{m.host / GiB:.0f}" + (f"+{m.disk / GiB:.0f}d" if m.disk else ""),
            "yes" if p.fits else "no",
            f"{p.cost.step:.2f}",
            f"{p.cost.mfu:.0%}",
        )
    if console is None:
        console = Console()
        if not console.is_terminal:
            console = Console(width=200)
    console.print(t)


def plot_memory(plans: list[Plan], path: Path, capacity: float) -> None:
    """Stacked bars of the device memory of ``plans`` against the device's ``capacity``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6, len(plans) * 0.9), 4.5))
    bottom = [0.0] * len(plans)
    for kind in _KINDS:
        vals = [p.memory.at_peak()[kind] / GiB for p in plans]
        ax.bar(range(len(plans)), vals, bottom=bottom, label=kind)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.axhline(capacity / GiB, color="k", linestyle="--", label="device memory")
    ax.set_xticks(range(len(plans)))
    ax.set_xticklabels([p.layout.describe() for p in plans], rotation=60, ha="right", fontsize=6)
    ax.set_ylabel("GiB per device")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
