"""The output directory of a run: checked before any work, and never silently overwritten.

[Note: one run per --out] ``--out`` holds one run: ``metrics.jsonl`` and ``checkpoint/``. A fresh
run refuses a directory that already holds one (``--resume`` continues it; a new ``--out`` starts
another). A resume continues from the checkpoint's step and refuses ``--steps`` below it, so a
later checkpoint is never overwritten with earlier weights nor ``latest`` moved back; the metrics
of steps after the checkpoint (a run killed after its last save) are dropped, so every step has
one record.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from colossal_contracts import ConfigError

from ..booster import find_checkpoint

__all__ = ["METRICS", "check_out", "trim_metrics"]

METRICS = "metrics.jsonl"


def _writable(out: Path) -> None:
    """``ConfigError`` unless ``out`` (or its nearest existing parent) is a writable directory."""
    probe = out
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir():
        raise ConfigError(
            f"--out {out}: {probe} is a file, not a directory; choose another --out path"
        )
    try:
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as err:
        raise ConfigError(
            f"--out {out} is not writable ({err.strerror or err}); choose a directory you can "
            "write to"
        ) from None


def check_out(out: Path, *, resume: bool) -> Path | None:
    """Check ``out`` before anything is built; return the checkpoint to resume (or None).
    Changes nothing on disk. See [Note: one run per --out]."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file; give a directory (new or holding a run)")
    _writable(out)
    ckpt_root = out / "checkpoint"
    if resume:
        found = find_checkpoint(ckpt_root)
        if found is None:
            raise ConfigError(
                f"--resume: no checkpoint under {ckpt_root}; start a fresh run without --resume "
                "(or point --out at the run you want to continue)"
            )
        return found
    held = [p.name for p in (out / METRICS, ckpt_root) if p.exists()]
    if held:
        raise ConfigError(
            f"--out {out} already holds a run ({', '.join(held)}); pass --resume to continue it, "
            "or choose a fresh --out"
        )
    return None


def trim_metrics(out: Path, last_step: int) -> None:
    """Keep only the records of steps up to ``last_step`` in ``out/metrics.jsonl`` (atomically)."""
    path = out / METRICS
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            step = json.loads(line).get("step")
        except (ValueError, AttributeError):
            continue  # a line cut short by a kill
        if isinstance(step, int) and step <= last_step:
            kept.append(line)
    tmp = path.with_name(f".{METRICS}.tmp")
    tmp.write_text("".join(k + "\n" for k in kept))
    os.replace(tmp, path)
