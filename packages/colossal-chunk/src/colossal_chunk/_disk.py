"""Chunk payloads kept in files on disk, memory-mapped so that they read back as CPU tensors.

[Note: disk payloads] Each payload is one file of exactly its bytes, mapped with
``torch.from_file(shared=True)``: writes go to the file, reads page in on demand, and host memory
holds only the pages in use. Files live in one directory the user picks (default: a fresh temporary
directory); ``close()`` removes every file, and the directory too when the store created it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import torch

from colossal_contracts import ConfigError

__all__ = ["DiskStore"]


class DiskStore:
    """Memory-mapped files, one per payload key, in ``directory``.

    Invariant: ``key in self`` exactly while a file for ``key`` exists.
    """

    _dir: Path
    _owns_dir: bool  # True when we created the directory and must remove it on close
    _files: dict[str, Path]

    def __init__(self, directory: str | os.PathLike[str] | None = None):
        if directory is None:
            self._dir = Path(tempfile.mkdtemp(prefix="colossal-chunks-"))
            self._owns_dir = True
        else:
            self._dir = Path(directory)
            try:
                self._dir.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ConfigError(
                    f"disk tier directory {str(self._dir)!r} cannot be created ({exc}); "
                    "pass a writable directory as disk_dir, or None for a temporary one"
                ) from exc
            self._owns_dir = False
        self._files = {}

    @property
    def directory(self) -> Path:
        return self._dir

    def __contains__(self, key: str) -> bool:
        return key in self._files

    def allocate(self, key: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A 1-D tensor of ``numel`` elements backed by a new file; its content is zeros."""
        self.discard(key)
        path = self._dir / f"{key}.bin"
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        with open(path, "wb") as f:
            f.truncate(max(nbytes, 1))
        self._files[key] = path
        if numel == 0:
            return torch.empty(0, dtype=dtype)
        return torch.from_file(str(path), shared=True, size=numel, dtype=dtype)

    def discard(self, key: str) -> None:
        """Remove the file of ``key`` (tensors still mapping it stay readable until dropped)."""
        path = self._files.pop(key, None)
        if path is not None:
            path.unlink(missing_ok=True)

    def close(self) -> None:
        """Remove every file, and the directory when this store created it."""
        for key in list(self._files):
            self.discard(key)
        if self._owns_dir:
            shutil.rmtree(self._dir, ignore_errors=True)
