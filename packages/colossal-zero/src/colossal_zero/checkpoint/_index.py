"""The check of a checkpoint's index before anything is read: every key present and of its type,
and every parameter's ranges a cover of its elements, exactly once ([Note: whole or not at all]
in ``_reader.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from colossal_contracts import CheckpointError

from ._layout import FORMAT

__all__ = ["validate_index"]


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _coverage_fault(meta: dict[str, Any], world: int) -> str | None:
    """What is wrong with ``meta``'s ranges as a cover of its flattened shape, exactly once."""
    numel = 1
    for d in meta["shape"]:
        numel *= d
    at = 0
    for rank, a, b in sorted(meta["ranges"], key=lambda r: r[1]):
        if not 0 <= rank < world:
            return f"name rank {rank}, outside world_size {world}"
        if a != at or b <= a:
            what = "overlap" if a < at else "leave a gap" if a > at else "hold an empty range"
            return f"{what} at element {min(a, at)} of {numel}"
        at = b
    if at != numel:
        return f"cover {at} of its {numel} elements"
    return None


def validate_index(index: Any, path: Path) -> None:
    """``CheckpointError`` naming the first key of ``path`` that is missing or of the wrong type."""

    def bad(what: str) -> CheckpointError:
        return CheckpointError(
            f"{path} is malformed: {what}; the index was edited or damaged (or is another "
            "tool's file): restore it or resume from another checkpoint"
        )

    if not isinstance(index, dict):
        raise bad("expected a JSON object")
    if index.get("format") != FORMAT:
        raise bad(f"unknown format {index.get('format')!r} (this version reads format {FORMAT})")
    if not _is_int(index.get("world_size")) or index["world_size"] < 1:
        raise bad("'world_size' must be a positive int")
    params = index.get("params")
    if not isinstance(params, dict):
        raise bad("'params' must be an object of parameter entries")
    for name, meta in params.items():
        ok = (
            isinstance(meta, dict)
            and isinstance(meta.get("shape"), list)
            and all(_is_int(d) and d >= 0 for d in meta["shape"])
            and isinstance(meta.get("ranges"), list)
            and all(
                isinstance(r, list) and len(r) == 3 and all(_is_int(v) for v in r)
                for r in meta["ranges"]
            )
        )
        if not ok:
            raise bad(f"entry {name!r} needs 'shape' (list of ints) and 'ranges' ([rank, a, b]s)")
        gap = _coverage_fault(meta, index["world_size"])
        if gap:
            raise bad(f"the 'ranges' of {name!r} {gap}")
    if not isinstance(index.get("aliases"), dict) or not all(
        isinstance(v, str) for v in index["aliases"].values()
    ):
        raise bad("'aliases' must map parameter names to names")
    if not isinstance(index.get("optimizer"), bool):
        raise bad("'optimizer' must be true or false")
    scaler = index.get("scaler")
    if scaler is not None and not (
        isinstance(scaler, dict)
        and all(isinstance(scaler.get(k), (int, float)) for k in ("scale", "num_skipped", "clean"))
    ):
        raise bad("'scaler' must be null or an object with numeric scale, num_skipped, clean")
    files = index.get("files", {})
    if not isinstance(files, dict) or not all(
        isinstance(v, dict) and isinstance(v.get("sha256"), str) and _is_int(v.get("bytes"))
        for v in files.values()
    ):
        raise bad("'files' must map file names to {sha256, bytes}")
