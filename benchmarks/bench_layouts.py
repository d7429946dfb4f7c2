"""Every layout ``colossal plan`` lists for GPT-nano, built and trained one step, on 4 and on 8
gloo ranks.

For each world size one World (ranks started once) takes the layouts ``enumerate_layouts``
lists for GPT-nano (fp32, sequence 32, global batch 4), of those that differ only in how a
step's samples are cut into pipeline micro-batches the one with the most, and builds each
through ``colossal train --layout``'s flags (``layout_flags``) and the job's plugin, then trains
one step on a fixed batch (``one_step_each`` in ``_layouts_runs.py``, which the stack's
``test_layouts_build`` runs on every listed layout, and in CI on a covering sample). Per layout: whether it built and
trained (a finite loss), the error's first line where not, rank 0's loss, and the slowest
rank's seconds for build plus step. A layout that fails on some ranks only (the others then
wait in a collective) ends its world; the next layout starts a fresh one.

``--quick``: 4 ranks only, every mesh once (its memory method taken in turn, a few with
activation checkpointing): ``sample(..., per_method=1)``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from _layouts_runs import BASE, listed_layouts, mesh_of, one_step_each, sample

from colossal.plan._layout import parse_layout
from colossal_testing import RankError, World

from _report import Report, load_note

PRELOAD = ("__main__", "torch", "torch.distributed", "colossal")
LAYOUT_TIMEOUT_S = 600.0


def _error_line(err: RankError) -> str:
    """The last line of a rank's traceback (the exception), or the time-out line."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    return lines[-1] if lines else "RankError"


def measure(world_size: int, texts: list[str]) -> list[dict[str, Any]]:
    """One row per layout of ``texts`` on a ``world_size``-rank world."""
    rows = []
    with World(world_size, timeout_s=LAYOUT_TIMEOUT_S, preload=PRELOAD) as world:
        for text in texts:
            t0 = time.perf_counter()
            try:
                per_rank = [r[text] for r in world.run(one_step_each, [text], BASE, True)]
                errors = [r["error"] for r in per_rank if r["error"]]
                error = errors[0] if errors else ""
                loss = per_rank[0]["loss"]
                seconds = max(r["seconds"] for r in per_rank)
            except RankError as err:  # failed on some ranks, or timed out: a fresh world next
                error, loss, seconds = _error_line(err), None, time.perf_counter() - t0
            lay = parse_layout(text)
            rows.append(
                {
                    "ranks": world_size,
                    "layout": text,
                    "mesh": mesh_of(text),
                    "method": lay.method,
                    "ckpt": lay.recompute == "full",
                    "built": not error,
                    "loss": loss if not error else "",
                    "seconds": seconds,
                    "error": error,
                }
            )
            print(f"layouts: {world_size} ranks, {text}: {error or f'loss {loss:.4f}'}")
    return rows


def run(quick: bool, out_dir: Path) -> Report:
    before = os.getloadavg()[0]
    sizes = (4,) if quick else (4, 8)
    report = Report(
        name="layouts",
        title="Layouts `colossal plan` lists for GPT-nano, built and trained one step: "
        + ("every 4-rank mesh once, on 4 gloo ranks" if quick else "all, on 4 and 8 gloo ranks"),
        columns=["ranks", "layout", "built", "loss", "seconds", "error"],
    )
    for n in sizes:
        listed = listed_layouts(n)
        texts = sample(listed, per_method=1) if quick else listed
        rows = measure(n, texts)
        report.rows += rows
        built = sum(r["built"] for r in rows)
        report.summary[f"built, {n} ranks"] = f"{built} of {len(rows)}"
        report.summary[f"listed layouts, {n} ranks (one per micro-batch split)"] = len(listed)
        report.summary[f"meshes, {n} ranks"] = len({r["mesh"] for r in rows})
        report.summary[f"seconds, {n} ranks (sum of the layouts)"] = sum(r["seconds"] for r in rows)
        failed = sorted({r["error"] for r in rows if r["error"]})
        if failed:
            report.summary[f"distinct errors, {n} ranks"] = "; ".join(failed)
    report.notes += [
        "Layouts: `enumerate_layouts` for GPT-nano (2 blocks, 2 heads, fp32), sequence 32, "
        "global batch 4 on the given ranks, as `colossal plan` lists them; layouts that differ "
        "only in their micro-batch split are run once (the split with the most micro-batches).",
        "Each is built through `colossal train --layout`'s flags and the job's plugin and trains "
        "one step (forward, backward, AdamW) on a fixed batch; 'built' means it did and its loss "
        "is finite. Loss: rank 0's (the data-parallel mean is not taken). Seconds: the slowest "
        "rank's build plus step, including the plugin's one-off set-up (process groups, chunk "
        "managers, disk tiers): a build-cost figure, not a step time; a world's first layout also "
        "pays the ranks' first imports and first use of every kernel.",
        "The stack's test_layouts_build runs every listed layout on 4 and 8 ranks (`nox -s "
        "layouts`), and in CI a covering sample: one layout per kind composed (tp mode x "
        "sequence parallelism x pipeline schedule x ZeRO stage or Gemini).",
        load_note(before),
    ]
    return report
