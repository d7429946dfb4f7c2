"""``ShardedSafetensorsWriter``: a state dict streamed tensor by tensor into safetensors shards
of bounded size, with the Hugging Face index (``model.safetensors.index.json``).

[Note: streamed export] Tensors are buffered until the next one would push the buffer past
``max_shard_bytes``; then the buffer is written as one shard under a hidden temporary name and
dropped, so at most one shard's bytes are held (a single tensor larger than the bound is a shard
of its own). ``close`` renames the shards to ``model-00001-of-0000N.safetensors`` (the total is
known only then) and writes the index last, through a temporary file and a rename: a directory
with the index is complete, one without it is an export cut short.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import TracebackType

import torch
from safetensors.torch import save_file

from colossal_contracts import ConfigError

__all__ = ["HF_INDEX", "ShardedSafetensorsWriter"]

HF_INDEX = "model.safetensors.index.json"


class ShardedSafetensorsWriter:
    """``with ShardedSafetensorsWriter(dir, max_shard_bytes=...) as w: w.add(name, t)``.

    Invariant: the shards hold every added tensor once (contiguous, as given), none holds more
    than ``max_shard_bytes`` unless it is one tensor, and the index maps each name to its shard.
    """

    def __init__(self, directory: Path, *, max_shard_bytes: int, prefix: str = "model") -> None:
        if (
            isinstance(max_shard_bytes, bool)
            or not isinstance(max_shard_bytes, int)
            or max_shard_bytes < 1
        ):
            raise ConfigError(f"max_shard_bytes must be a positive int, got {max_shard_bytes!r}")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_shard_bytes, self.prefix = max_shard_bytes, prefix
        self._buffer: dict[str, torch.Tensor] = {}
        self._buffer_bytes = 0
        self._shards: list[tuple[Path, list[str]]] = []  # temporary file, names in it
        self._names: set[str] = set()
        self.total_bytes = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        """Queue ``tensor`` under ``name``; may write a full shard first."""
        if name in self._names:
            raise ConfigError(f"tensor {name!r} was added twice to the sharded export")
        self._names.add(name)
        size = tensor.numel() * tensor.element_size()
        if self._buffer and self._buffer_bytes + size > self.max_shard_bytes:
            self._flush()
        self._buffer[name] = tensor.detach().contiguous().cpu()
        self._buffer_bytes += size
        self.total_bytes += size

    def _flush(self) -> None:
        if not self._buffer:
            return
        tmp = self.directory / f".{self.prefix}-part{len(self._shards):05d}.tmp"
        save_file(self._buffer, str(tmp), metadata={"format": "pt"})
        self._shards.append((tmp, list(self._buffer)))
        self._buffer, self._buffer_bytes = {}, 0

    def close(self) -> Path:
        """Write the last shard, name the shards, write the index; returns the index path."""
        self._flush()
        n = len(self._shards)
        weight_map: dict[str, str] = {}
        for i, (tmp, names) in enumerate(self._shards):
            final = f"{self.prefix}-{i + 1:05d}-of-{n:05d}.safetensors"
            os.replace(tmp, self.directory / final)
            weight_map.update(dict.fromkeys(names, final))
        index = {"metadata": {"total_size": self.total_bytes}, "weight_map": weight_map}
        path = self.directory / HF_INDEX
        tmp_index = self.directory / f".{HF_INDEX}.tmp"
        with open(tmp_index, "w") as fh:
            fh.write(json.dumps(index, indent=2))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp_index, path)
        self._shards = []
        return path

    def abort(self) -> None:
        """Remove the shards written so far (an export that failed)."""
        for tmp, _ in self._shards:
            tmp.unlink(missing_ok=True)
        self._shards, self._buffer = [], {}

    def __enter__(self) -> ShardedSafetensorsWriter:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        err: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if kind is None:
            self.close()
        else:
            self.abort()
