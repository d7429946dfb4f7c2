"""The disk tier's directory, checked before anything runs."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from colossal_contracts import ConfigError

__all__ = ["check_disk_dir"]

_MIN_FREE = 1 << 20  # below this a filesystem counts as full


def check_disk_dir(directory: str | os.PathLike[str] | None, budget: int | None) -> int:
    """Check that the disk tier can use ``directory`` (None: the temporary directory) for
    ``budget`` bytes (None: no limit) before anything runs; returns its free bytes.

    ``ConfigError`` (one line, naming the fix) when it is missing, not a directory, unwritable,
    on a full filesystem, or has less free space than ``budget``. Writes only a probe file it
    removes again.
    """
    where = Path(tempfile.gettempdir() if directory is None else directory)
    if not where.exists():
        raise ConfigError(
            f"disk tier directory {str(where)!r} does not exist; create it or pass another "
            "--disk-dir (disk_dir)"
        )
    if not where.is_dir():
        raise ConfigError(f"disk tier directory {str(where)!r} is not a directory; pass a folder")
    try:
        with tempfile.TemporaryFile(dir=where, prefix=".colossal-probe-") as f:
            f.write(b"\0")
            f.flush()
    except OSError as exc:
        raise ConfigError(
            f"disk tier directory {str(where)!r} is not writable ({exc.strerror}); pass a "
            "directory you can write to as --disk-dir (disk_dir)"
        ) from exc
    free = shutil.disk_usage(where).free
    if free < _MIN_FREE:
        raise ConfigError(
            f"disk tier directory {str(where)!r} is on a full filesystem ({free:,} bytes free); "
            "free space there or pass another --disk-dir (disk_dir)"
        )
    if budget is not None and budget > free:
        raise ConfigError(
            f"disk budget of {budget:,} bytes is larger than the {free:,} bytes free under "
            f"{str(where)!r}; lower --disk-budget (disk_budget) to at most {free:,} or free space"
        )
    return free
