"""The progress display and summary of a training run (rich), shown on rank 0 only."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

__all__ = [
    "TrainDisplay",
    "comm_bytes",
    "comm_summary",
    "memory_summary",
    "plot_memory_timeline",
    "summary_table",
]

_COMM = re.compile(r"comm_(\w+)_bytes_total")


def _mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB"


def _size(n: float) -> str:
    """Bytes in the largest binary unit that keeps the figure at 1 or more."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n:,.0f} B"


class TrainDisplay:
    """A progress bar with loss, tokens/s and memory; silent when ``enabled`` is False."""

    def __init__(self, total: int, *, enabled: bool, console: Console | None = None):
        self.enabled = enabled
        self.console = console or Console(stderr=True)
        self._progress = Progress(
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[stats]}"),
            TimeRemainingColumn(),
            console=self.console,
            disable=not enabled,
        )
        self._task = self._progress.add_task("train", total=total, stats="")

    def __enter__(self) -> TrainDisplay:
        self._progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.__exit__(*exc)

    def update(self, record: dict[str, Any], *, advance: int = 1) -> None:
        stats = f"loss {record['loss']:.4f}  {record['tokens_per_s']:,.0f} tok/s  mem {_mib(record['host_rss_bytes'])}"
        if "accelerator_peak_bytes" in record:
            emulated = " (emulated)" if record.get("accelerator_emulated") else ""
            stats += f"  acc{emulated} {_mib(record['accelerator_peak_bytes'])}"
            stats += f"  host {_mib(record.get('host_peak_bytes', 0))}"
            if "disk_peak_bytes" in record:
                stats += f"  disk {_mib(record['disk_peak_bytes'])}"
        elif "accelerator_bytes" in record:
            stats += f"  acc {_mib(record['accelerator_bytes'])}"
        if "bytes_moved" in record:
            stats += f"  moved {_mib(record['bytes_moved'])}"
        if "disk_read_bytes" in record:  # read ahead / faulted in on use / written behind
            rfw = ("disk_read_bytes", "disk_faulted_bytes", "disk_written_bytes")
            stats += "  disk r/f/w " + "/".join(_mib(record.get(k, 0)) for k in rfw)
        comm = comm_bytes(record)
        if comm:
            stats += "  comm " + " ".join(f"{axis} {_size(n)}" for axis, n in comm.items())
        self._progress.update(self._task, advance=advance, stats=stats)


def summary_table(summary: dict[str, Any]) -> Table:
    table = Table(title="colossal train: summary", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value", justify="right")
    for k, v in summary.items():
        table.add_row(k, f"{v:,.4g}" if isinstance(v, float) else str(v))
    return table


def memory_summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-tier peaks and bytes moved over a run, from its metrics records (empty without them)."""
    if not records or "bytes_moved" not in records[-1]:
        return {}
    out: dict[str, Any] = {}
    for tier in ("accelerator", "host", "disk"):
        key = f"{tier}_peak_bytes"
        if key in records[-1]:
            label = f"{tier} peak" + (
                " (emulated)"
                if tier == "accelerator" and records[-1].get("accelerator_emulated")
                else ""
            )
            out[label] = _mib(max(r.get(key, 0) for r in records))
    out["bytes moved"] = _mib(sum(r["bytes_moved"] for r in records))
    if "disk_read_bytes" in records[-1]:  # disk I/O and the throughput background I/O reached
        for what, b_key, s_key in (
            ("read ahead", "disk_read_bytes", "disk_read_s"),
            ("faulted in (not read ahead)", "disk_faulted_bytes", None),  # on the step's path
            ("written", "disk_written_bytes", "disk_write_s"),
            ("not rewritten (kept on disk)", "disk_unwritten_bytes", None),
        ):
            nbytes = sum(r.get(b_key, 0) for r in records)
            secs = sum(r.get(s_key, 0) for r in records) if s_key else 0
            rate = f" ({nbytes / secs / 2**20:,.0f} MiB/s)" if secs > 0 else ""
            out[f"disk {what}"] = _mib(nbytes) + rate
        busy = sum(r.get("disk_busy_s", 0) for r in records)
        if busy > 0:  # reads and writes together, each second once (read and written / busy)
            moved = sum(
                r.get(k, 0) for r in records for k in ("disk_read_bytes", "disk_written_bytes")
            )
            out["disk read + written"] = (
                f"{moved / busy / 2**20:,.0f} MiB/s over {busy:,.1f} s busy"
            )
    return out


def comm_bytes(record: dict[str, Any]) -> dict[str, int]:
    """Axis -> bytes a rank counted on it since the start (the plugin's ``comm_<axis>_bytes_total``)."""
    out = {}
    for key, value in record.items():
        m = _COMM.fullmatch(key)
        if m:
            out[m.group(1)] = int(value)
    return out


def comm_summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The mesh and, per axis, rank 0's counted communication bytes over the run and per step
    (empty for plugins without a mesh)."""
    if not records or "mesh" not in records[-1]:
        return {}
    out: dict[str, Any] = {"mesh": records[-1]["mesh"]}
    first, last = comm_bytes(records[0]), comm_bytes(records[-1])
    steps = len(records)
    for axis, total in last.items():
        # the counters run from the plugin's start: the first record holds one step of them
        per_step = (total - first.get(axis, 0)) / (steps - 1) if steps > 1 else total
        out[f"comm {axis} (rank 0)"] = f"{_size(total)} ({_size(per_step)}/step)"
    return out


def plot_memory_timeline(records: list[dict[str, Any]], out: Path) -> Path:
    """``out/memory_timeline.png``: per step, each tier's peak bytes and the bytes moved."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in records]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    for tier in ("accelerator", "host", "disk"):
        key = f"{tier}_peak_bytes"
        if key in records[-1]:
            label = tier + (
                " (emulated)"
                if tier == "accelerator" and records[-1].get("accelerator_emulated")
                else ""
            )
            ax1.plot(steps, [r.get(key, 0) / 2**20 for r in records], label=label)
    ax1.set_ylabel("peak chunk bytes (MiB)")
    ax1.legend(loc="upper right")
    ax1.set_title("Gemini memory per step")
    ax2.bar(steps, [r["bytes_moved"] / 2**20 for r in records], color="#dd8452")
    ax2.set_ylabel("bytes moved (MiB)")
    ax2.set_xlabel("step")
    fig.tight_layout()
    path = out / "memory_timeline.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
