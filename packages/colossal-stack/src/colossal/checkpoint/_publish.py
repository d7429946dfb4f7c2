"""Publishing checkpoint directories atomically, finding the newest complete one, verifying it.

[Note: atomic checkpoints] A checkpoint is a directory ``step-<N>`` beside a ``latest`` file naming
it. It is written under a hidden temporary name ``.step-<N>-*``; its last file is
``manifest.json`` (size and SHA-256 of every other file), so a directory with a manifest whose
files all exist at their sizes is *complete*. Files and directory are fsynced, then published:

1. if ``step-<N>`` does not exist yet: rename the temporary directory to it, then point ``latest``
   at it (the pointer is replaced by rename too);
2. if it does (re-saving a step): point ``latest`` at the complete temporary directory first,
   only then remove the old ``step-<N>``, rename the new one in and point ``latest`` back.

No step is deleted before its replacement is complete and named by ``latest``. A kill at any
moment leaves either ``latest`` naming a complete directory or (between the rename and the
pointer update of case 2) naming the hidden name of a complete ``step-<N>``, which
``find_checkpoint`` follows to ``step-<N>``; only when ``latest`` is missing or names nothing
complete does it fall back to the newest complete ``step-<N>``. The next save cleans
up after killed ones: an incomplete hidden directory is removed, a complete one whose publish was
cut short is published (renamed to its ``step-<N>``), never deleted unseen.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from colossal_contracts import CheckpointError
from colossal_zero.checkpoint import INDEX_FILE, file_digest

__all__ = [
    "LATEST",
    "MANIFEST",
    "clean_orphans",
    "explain_no_checkpoint",
    "find_checkpoint",
    "is_complete",
    "latest_checkpoint",
    "publish_dir",
    "verify_manifest",
    "write_checkpoint_dir",
]

LATEST = "latest"
MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1
_STEP = re.compile(r"step-(\d+)")
_HIDDEN = re.compile(r"\.step-(\d+)-.+")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _written_digests(directory: Path) -> dict[str, dict]:
    """Digests a Gemini save computed while writing its files (its index's ``files``), so
    they are not read a second time; {} when there is no such index."""
    try:
        files = json.loads((directory / INDEX_FILE).read_text()).get("files", {})
    except (OSError, ValueError, AttributeError):
        return {}
    return files if isinstance(files, dict) else {}


def _write_manifest(directory: Path, step: int) -> None:
    files = {}
    known = _written_digests(directory)
    for f in sorted(directory.iterdir()):
        if f.is_file() and f.name != MANIFEST:
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
            digest = known.get(f.name)
            ok = isinstance(digest, dict) and digest.get("bytes") == f.stat().st_size
            files[f.name] = digest if ok else file_digest(f)
    body = json.dumps({"format": MANIFEST_FORMAT, "step": step, "files": files}, indent=1)
    with open(directory / MANIFEST, "w") as fh:
        fh.write(body)
        fh.flush()
        os.fsync(fh.fileno())
    _fsync_dir(directory)


def _read_manifest(directory: Path) -> dict | None:
    """The manifest's ``files`` table, or None when it is absent or malformed."""
    try:
        files = json.loads((directory / MANIFEST).read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    ok = isinstance(files, dict) and all(
        isinstance(v, dict) and isinstance(v.get("bytes"), int) and isinstance(v.get("sha256"), str)
        for v in files.values()
    )
    return files if ok else None


def is_complete(directory: Path) -> bool:
    """A readable manifest whose every file exists with its recorded size (cheap: no hashing)."""
    files = _read_manifest(directory)
    if files is None:
        return False
    try:
        return all((directory / n).stat().st_size == v["bytes"] for n, v in files.items())
    except OSError:
        return False


def _manifest_error(path: Path, field: str, what: str) -> CheckpointError:
    return CheckpointError(
        f"{path}: {field!r} {what}; the checkpoint was edited, damaged or written by another "
        "version: resume from another step-N directory"
    )


def verify_manifest(directory: Path) -> int:
    """Check ``manifest.json`` (present, of a known ``format``, its ``step`` that of a
    ``step-<N>`` folder) and every file's size and SHA-256 against it; the manifest's step.
    ``CheckpointError`` naming the file and the field at fault."""
    path = directory / MANIFEST
    try:
        body = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(
            f"{path} is missing: the save of {directory.name} was cut short (or the file was "
            "deleted), so its files cannot be checked; resume from another step-N directory"
        ) from None
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise CheckpointError(f"{path} is unreadable ({err}); resume from another step-N") from None
    if not isinstance(body, dict):
        raise CheckpointError(f"{path} must hold a JSON object; resume from another step-N")
    fmt = body.get("format")
    if fmt != MANIFEST_FORMAT:
        raise _manifest_error(
            path, "format", f"is {fmt!r}, and this version reads format {MANIFEST_FORMAT}"
        )
    step = body.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise _manifest_error(path, "step", f"is {step!r}, not a non-negative int")
    folder = _STEP.fullmatch(directory.name)
    if folder and int(folder.group(1)) != step:
        raise _manifest_error(path, "step", f"is {step}, and its folder is {directory.name}")
    files = _read_manifest(directory)
    if files is None:
        raise _manifest_error(path, "files", "is not a table of bytes and sha256")
    for name, want in files.items():
        file = directory / name
        if not file.is_file():
            raise CheckpointError(f"checkpoint file {file} is missing (listed in {MANIFEST})")
        if file.stat().st_size != want["bytes"] or file_digest(file)["sha256"] != want["sha256"]:
            raise CheckpointError(
                f"checkpoint file {file} does not match the checksum in {MANIFEST}: it was "
                "changed or copied from another run; restore it or resume from another step-N"
            )
    return step


def _point_latest(root: Path, name: str) -> None:
    pointer = root / f".{LATEST}.tmp"
    with open(pointer, "w") as fh:
        fh.write(name + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(pointer, root / LATEST)
    _fsync_dir(root)


def _latest_name(root: Path) -> str | None:
    try:
        return (root / LATEST).read_text().strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def publish_dir(root: Path, tmp: Path, final: Path) -> None:
    """Make the complete directory ``tmp`` the checkpoint ``final`` and ``latest`` name it,
    following [Note: atomic checkpoints]."""
    if final.exists():
        _point_latest(root, tmp.name)  # the new copy is named before the old one goes
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(root)
    _point_latest(root, final.name)


def clean_orphans(root: Path, *, keep: Path | None = None) -> None:
    """Finish or remove what killed saves left under ``root``: incomplete hidden directories are
    removed; complete ones are published as their ``step-<N>`` (or removed when an identical
    step is already complete and ``latest`` does not name them). ``keep`` is left alone."""
    if not root.is_dir():
        return
    latest = _latest_name(root)
    for d in sorted(root.iterdir()):
        m = _HIDDEN.fullmatch(d.name)
        if not m or not d.is_dir() or d == keep:
            continue
        final = root / f"step-{m.group(1)}"
        if not is_complete(d):
            shutil.rmtree(d, ignore_errors=True)
        elif latest == d.name or not is_complete(final):
            publish_dir(root, d, final)  # a publish cut short: finish it
            latest = _latest_name(root)
        else:
            shutil.rmtree(d, ignore_errors=True)
    stale = root / f".{LATEST}.tmp"
    if stale.exists():
        stale.unlink(missing_ok=True)


def write_checkpoint_dir(root: Path, step: int, write: Callable[[Path], None]) -> Path:
    """Call ``write(tmpdir)``, add the manifest, and publish it as ``root/step-<step>``.
    A failure at any point leaves the previous checkpoints and ``latest`` as they were."""
    root.mkdir(parents=True, exist_ok=True)
    clean_orphans(root)
    final = root / f"step-{step}"
    tmp = Path(tempfile.mkdtemp(prefix=f".step-{step}-", dir=root))
    try:
        write(tmp)
        _write_manifest(tmp, step)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    publish_dir(root, tmp, final)
    return final


def _complete_steps(root: Path) -> list[tuple[int, Path]]:
    out = []
    for d in root.iterdir() if root.is_dir() else ():
        m = _STEP.fullmatch(d.name)
        if m and d.is_dir() and is_complete(d):
            out.append((int(m.group(1)), d))
    return sorted(out)


def find_checkpoint(root: Path) -> Path | None:
    """The complete checkpoint ``root/latest`` names; else the newest complete ``step-<N>``;
    None when there is none (a directory without a manifest is never complete)."""
    name = _latest_name(root)
    if name is not None and "/" not in name and name not in (".", ".."):
        named = root / name
        if named.is_dir() and is_complete(named):
            return named
        hidden = _HIDDEN.fullmatch(name)  # a re-save renamed it in; the pointer lagged behind
        if hidden and is_complete(root / f"step-{hidden.group(1)}"):
            return root / f"step-{hidden.group(1)}"
    steps = _complete_steps(root)
    return steps[-1][1] if steps else None


def _why_incomplete(directory: Path) -> str:
    """Why ``directory`` is not a complete checkpoint, naming the file (and field)."""
    path = directory / MANIFEST
    if not path.exists():
        return f"{path} is missing (its save was cut short)"
    files = _read_manifest(directory)
    if files is None:
        return f"{path} is malformed (its 'files' table)"
    for name, want in files.items():
        try:
            size = (directory / name).stat().st_size
        except OSError:
            return f"{directory / name} is missing (listed in {MANIFEST})"
        if size != want["bytes"]:
            return f"{directory / name} has {size} bytes, {MANIFEST} says {want['bytes']}"
    return f"{directory} is incomplete"


def explain_no_checkpoint(root: Path) -> str:
    """Why ``find_checkpoint(root)`` found nothing: each ``step-N`` directory and its fault."""
    root = Path(root)
    if not root.is_dir():
        return f"{root} does not exist"
    steps = sorted((int(m.group(1)), d) for d in root.iterdir() if (m := _STEP.fullmatch(d.name)))
    if not steps:
        return f"no step-N directory under {root}; the run was stopped before its first save"
    return "; ".join(_why_incomplete(d) for _, d in steps[-3:])


def latest_checkpoint(root: Path) -> Path:
    """``find_checkpoint(root)``; ``CheckpointError`` saying how to start fresh when none."""
    found = find_checkpoint(Path(root))
    if found is None:
        raise CheckpointError(
            f"no usable checkpoint under {root}: {explain_no_checkpoint(Path(root))}; start a "
            "fresh run (`colossal train --restart` moves the old one aside), or point --out at "
            "the run to continue"
        )
    return found
