"""The progress display and summary of a training run (rich), shown on rank 0 only."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

__all__ = ["TrainDisplay", "summary_table"]


def _mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB"


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
        if "accelerator_bytes" in record:
            stats += f"  acc {_mib(record['accelerator_bytes'])}"
        if "bytes_moved" in record:
            stats += f"  moved {_mib(record['bytes_moved'])}"
        self._progress.update(self._task, advance=advance, stats=stats)


def summary_table(summary: dict[str, Any]) -> Table:
    table = Table(title="colossal train: summary", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value", justify="right")
    for k, v in summary.items():
        table.add_row(k, f"{v:,.4g}" if isinstance(v, float) else str(v))
    return table
