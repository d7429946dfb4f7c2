"""Reports a person reads: a rich table and a PNG timeline of model vs non-model data per moment."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rich.console import Console, JustifyMethod
from rich.table import Table

from colossal_contracts import TierName

from ._stats import MemStats

__all__ = ["plot_timeline", "print_report", "stats_table"]

_MIB = 1024 * 1024
_PHASE_COLOURS = {"forward": "#e8f1fb", "backward": "#fdf0e6", "optimizer": "#eef7ea"}


def _mib(n: int) -> str:
    return f"{n / _MIB:,.2f}"


def _title(stats: MemStats, tier: str) -> str:
    how = "static estimate on meta" if stats.source == "static-estimate" else stats.source
    emu = ", emulated accelerator" if stats.emulated and tier == TierName.ACCELERATOR.value else ""
    return f"memory per moment, {tier} tier ({how}, device {stats.device}{emu})"


def stats_table(
    stats: MemStats, tier: TierName | str = TierName.ACCELERATOR, *, max_rows: int = 60
) -> Table:
    """One row per moment (the middle elided beyond ``max_rows``), sizes in MiB."""
    t = TierName(tier).value
    table = Table(title=_title(stats, t), title_justify="left")
    columns: tuple[tuple[str, JustifyMethod], ...] = (("#", "right"), ("moment", "left"), ("phase", "left"), ("params", "right"),
                      ("model MiB", "right"), ("non-model peak MiB", "right"),
                      ("total peak MiB", "right"))  # fmt: skip
    for col, just in columns:
        table.add_column(col, justify=just, no_wrap=col == "moment")
    peak = stats.peak_bytes(t)
    rows = list(stats.moments)
    if len(rows) > max_rows:
        half = max_rows // 2
        rows = [*rows[:half], None, *rows[-half:]]
    for m in rows:
        if m is None:
            table.add_row("…", "…", "", "", "", "", "")
            continue
        total = int(m.total_peak.get(t, 0))
        style = "bold red" if total == peak and peak else None
        table.add_row(
            str(m.index), m.label, m.phase, str(len(m.params)),
            _mib(int(m.model_bytes.get(t, 0))), _mib(int(m.non_model_peak.get(t, 0))),
            _mib(total), style=style,
        )  # fmt: skip
    s = stats.summary(t)
    table.caption = (
        f"peak {_mib(s['peak_bytes'])} MiB; non-model peak {_mib(s['peak_non_model_bytes'])} MiB; "
        f"model data at end {_mib(s['model_bytes_end'])} MiB; {s['num_moments']} moments"
    )
    return table


def print_report(
    stats: MemStats, tier: TierName | str = TierName.ACCELERATOR, *, console: Console | None = None
) -> None:
    """Print ``stats_table`` to ``console`` (stdout by default)."""
    (console or Console()).print(stats_table(stats, tier))


def plot_timeline(
    stats: MemStats,
    path: str | Path,
    *,
    tiers: Sequence[TierName | str] = (TierName.ACCELERATOR, TierName.HOST),
) -> Path:
    """Write a PNG: per tier, model data (stacked under) non-model peak for every moment.

    Tiers on which nothing was seen are left out. Phases are shaded (forward blue, backward
    orange, optimizer green); the accelerator panel says when it is emulated.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [TierName(t).value for t in tiers]
    names = [t for t in names if stats.peak_bytes(t) > 0] or names[:1]
    fig, axes = plt.subplots(len(names), 1, figsize=(12, 3.2 * len(names)), squeeze=False)
    xs = [m.index for m in stats.moments]
    for ax, t in zip(axes[:, 0], names):
        model = [m.model_bytes.get(t, 0) / _MIB for m in stats.moments]
        non_model = [m.non_model_peak.get(t, 0) / _MIB for m in stats.moments]
        for m in stats.moments:
            colour = _PHASE_COLOURS.get(m.phase)
            if colour:
                ax.axvspan(m.index - 0.5, m.index + 0.5, color=colour, lw=0)
        ax.bar(xs, model, width=0.9, color="#4c72b0", label="model data (end of moment)")
        ax.bar(xs, non_model, width=0.9, bottom=model, color="#dd8452", label="non-model peak")
        total = [m.total_peak.get(t, 0) / _MIB for m in stats.moments]
        ax.plot(xs, total, "k_", ms=12, mew=2, label="total peak")
        ax.set_ylabel("MiB")
        ax.set_title(_title(stats, t), fontsize=10, loc="left")
        ax.set_xlim(-0.5, max(len(xs) - 0.5, 0.5))
        ax.legend(loc="upper left", fontsize=8)
    axes[-1, 0].set_xlabel("moment (forward shaded blue, backward orange, optimizer green)")
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
