"""What every benchmark returns, and how it is written to benchmarks/results/."""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch


@dataclass
class Report:
    """A benchmark's figures.

    Attributes:
        name: the benchmark's name (file stem under results/).
        title: one line saying what was measured.
        columns: column order of ``rows`` in the Markdown table.
        rows: one dict per measured configuration.
        summary: headline figures (ratios, aims met), also printed.
        notes: plain sentences: method, what is emulated, caveats.
        figures: file names of plots this benchmark wrote next to its results.
    """

    name: str
    title: str
    columns: list[str]
    rows: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    figures: list[str] = field(default_factory=list)


def environment() -> dict[str, Any]:
    """The facts a reader needs to judge the figures."""
    cuda = torch.cuda.is_available()
    return {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if cuda else None,
        "accelerator": "cuda" if cuda else "emulated (CPU with a byte budget)",
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def load_note(before: float, what: str = "figures move with it") -> str:
    """One sentence on the host's measured load: its cores and the 1-minute load average at the
    run's start (``before``, from ``os.getloadavg()``) and now."""
    return (
        f"Host: {os.cpu_count()} CPU cores; 1-minute load average {before:.1f} before the run and "
        f"{os.getloadavg()[0]:.1f} at its end (the run's own threads and processes count); {what}."
    )


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def to_markdown(report: Report, env: dict[str, Any], quick: bool) -> str:
    lines = [f"# {report.title}", ""]
    lines.append(
        f"`python benchmarks/run.py {report.name}{' --quick' if quick else ''}` — "
        + ", ".join(f"{k}: {v}" for k, v in env.items())
    )
    lines.append("")
    if report.rows:
        lines.append("| " + " | ".join(report.columns) + " |")
        lines.append("|" + "---|" * len(report.columns))
        for row in report.rows:
            lines.append("| " + " | ".join(_fmt(row.get(c, "")) for c in report.columns) + " |")
        lines.append("")
    if report.summary:
        lines += ["## Summary", ""] + [f"- **{k}**: {_fmt(v)}" for k, v in report.summary.items()]
        lines.append("")
    if report.notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in report.notes] + [""]
    for fig in report.figures:
        lines.append(f"![{fig}]({fig})")
    return "\n".join(lines) + "\n"


def result_stem(stem: str, quick: bool) -> str:
    """The file stem a result is written under: ``--quick`` runs add ``_quick``, so a small run
    never overwrites a full run's figures (``NAME.json`` / ``NAME.md`` are full runs only)."""
    return f"{stem}_quick" if quick else stem


def write(
    report: Report, results_dir: Path, quick: bool, figures_dir: Path | None = None
) -> tuple[Path, Path]:
    """Write ``NAME.json`` and ``NAME.md`` (``NAME_quick.*`` for a quick run: ``result_stem``);
    return their paths. Plots the benchmark wrote under ``figures_dir`` (default
    ``results_dir``) are moved beside them under the same rule (``movement_quick.png``)."""
    results_dir.mkdir(parents=True, exist_ok=True)
    src = figures_dir or results_dir
    figures = []
    for fig in report.figures:
        name = result_stem(Path(fig).stem, quick) + Path(fig).suffix
        if src / fig != results_dir / name:
            shutil.move(src / fig, results_dir / name)
        figures.append(name)
    report = dataclasses.replace(report, figures=figures)
    env = environment()
    payload = {
        "name": report.name,
        "title": report.title,
        "quick": quick,
        "environment": env,
        "columns": report.columns,
        "rows": report.rows,
        "summary": report.summary,
        "notes": report.notes,
        "figures": report.figures,
    }
    stem = result_stem(report.name, quick)
    js = results_dir / f"{stem}.json"
    md = results_dir / f"{stem}.md"
    js.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    md.write_text(to_markdown(report, env, quick))
    return js, md
