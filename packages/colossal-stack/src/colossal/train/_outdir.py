"""The output directory of a run: checked before any work, and never silently overwritten.

[Note: one run per --out] ``--out`` holds one run: ``metrics.jsonl`` and ``checkpoint/``. A fresh
run refuses a directory that already holds one (``--resume`` continues it; a new ``--out`` starts
another). A resume continues from the checkpoint's step and refuses ``--steps`` below it, so a
later checkpoint is never overwritten with earlier weights nor ``latest`` moved back; the metrics
of steps after the checkpoint (a run killed after its last save) are dropped, so every step has
one record. ``--restart`` moves a run aside (its files moved into ``<out>.old-<k>``, never deleted) and
starts a fresh one in ``--out``; ``--resume`` on a run with no usable checkpoint says why and
offers it. Everything here runs under the run lock ([Note: run lock]).
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist

from colossal_contracts import ConfigError

from ..booster import explain_no_checkpoint, find_checkpoint
from ._runlock import RunLock

__all__ = [
    "METRICS",
    "Claim",
    "check_out",
    "claim_out",
    "claim_out_on_rank0",
    "move_aside",
    "trim_metrics",
]

METRICS = "metrics.jsonl"


def _writable(out: Path) -> None:
    """``ConfigError`` unless ``out`` (or its nearest existing parent) is a writable directory."""
    if out.is_symlink() and not out.exists():
        raise ConfigError(
            f"--out {out} is a symbolic link to {os.readlink(out)}, which does not exist; create "
            "its target or choose another --out"
        )
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


def _check_place(out: Path) -> None:
    longest = max((len(part.encode()) for part in out.parts), default=0)
    if longest > 255:
        raise ConfigError(
            f"--out has a name of {longest} bytes; a file system allows at most 255 per name: "
            "choose a shorter --out"
        )
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file; give a directory (new or holding a run)")
    _writable(out)


def _aside_name(out: Path) -> Path:
    k = 1
    while (aside := out.with_name(f"{out.name}.old-{k}")).exists() or aside.is_symlink():
        k += 1
    return aside


def check_out(out: Path, *, resume: bool) -> Path | None:
    """Check ``out`` before anything is built; return the checkpoint to resume (or None).
    Changes nothing on disk. See [Note: one run per --out]."""
    out = Path(out)
    _check_place(out)
    ckpt_root = out / "checkpoint"
    held = [p.name for p in (out / METRICS, ckpt_root) if p.exists()]
    if resume:
        found = find_checkpoint(ckpt_root)
        if found is None:
            if not held:
                raise ConfigError(
                    f"--resume: {out} holds no run; start a fresh run without --resume (or "
                    "point --out at the run you want to continue)"
                )
            raise ConfigError(
                f"--resume: {out} holds no usable checkpoint ({explain_no_checkpoint(ckpt_root)}); "
                f"pass --restart instead to move this run aside to {_aside_name(out)} and "
                "start afresh"
            )
        return found
    if held:
        raise ConfigError(
            f"--out {out} already holds a run ({', '.join(held)}); pass --resume to continue it, "
            "--restart to move it aside and start afresh, or choose a fresh --out"
        )
    return None


def move_aside(out: Path) -> Path | None:
    """Rename the run in ``out`` (its lock file aside) to ``<out>.old-<k>``; None when ``out``
    holds nothing. Never deletes. The caller holds ``out``'s lock."""
    out = Path(out)
    held = [p for p in out.iterdir() if p.name != ".lock"] if out.is_dir() else []
    if not held:
        return None
    aside = _aside_name(out)
    aside.mkdir()
    for p in held:
        os.replace(p, aside / p.name)
    return aside


@dataclass(frozen=True)
class Claim:
    """``--out`` locked for this run: the checkpoint to resume and where ``--restart`` moved
    the old run (None each when there is none)."""

    lock: RunLock | None  # None on ranks other than 0
    resume_from: Path | None
    moved_aside: Path | None


def claim_out(out: Path, *, resume: bool, restart: bool) -> Claim:
    """Lock ``out`` for this run ([Note: run lock]) and check it under the lock. With
    ``restart`` a run in ``out`` is moved aside first. ``ConfigError`` leaves ``out`` as it was
    (and no folder made for it)."""
    out = Path(out)
    if resume and restart:
        raise ConfigError(
            "--resume and --restart exclude each other: continue the run, or move it "
            "aside and start afresh"
        )
    _check_place(out)
    lock = RunLock(out)
    lock.acquire()
    try:
        moved = move_aside(out) if restart else None
        return Claim(lock, check_out(out, resume=resume), moved)
    except BaseException:
        lock.release(undo_mkdir=True)
        raise


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


def claim_out_on_rank0(out: Path, resume: bool, restart: bool, *, rank: int, world: int) -> Claim:
    """Rank 0 claims ``out`` (``claim_out``); every rank gets its verdict: the checkpoint to
    resume, or the same one-line ``ConfigError``. Collective when ``world > 1``."""
    claim, error = None, None
    if rank == 0:
        try:
            claim = claim_out(out, resume=resume, restart=restart)
        except ConfigError as err:
            error = str(err)
    if world > 1:
        box: list[Any] = [(error, claim.resume_from if claim else None)]
        dist.broadcast_object_list(box, src=0)
        error, resume_from = box[0]
        if rank != 0 and error is None:
            claim = Claim(None, resume_from, None)
    if error is not None or claim is None:
        raise ConfigError(error or f"--out {out}: rank 0 could not claim it")
    return claim
