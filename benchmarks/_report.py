"""What every benchmark returns, and how it is written to benchmarks/results/."""

from __future__ import annotations

import json
import platform
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


def write(report: Report, results_dir: Path, quick: bool) -> tuple[Path, Path]:
    """Write ``NAME.json`` and ``NAME.md``; return their paths."""
    results_dir.mkdir(parents=True, exist_ok=True)
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
    js = results_dir / f"{report.name}.json"
    md = results_dir / f"{report.name}.md"
    js.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    md.write_text(to_markdown(report, env, quick))
    return js, md
