"""``ShardedSafetensorsWriter``: a state dict streamed tensor by tensor into safetensors shards
of bounded size, with the Hugging Face index (``model.safetensors.index.json``).

[Note: streamed export] Each tensor's bytes go to the open shard's file as soon as it is added
(a hidden temporary name); the header is written last into room kept for it at the file's start
and padded with spaces ([Note: streamed safetensors] in colossal-zero), so the writer holds no
tensor after ``add`` returns: host memory is the one tensor being written, whatever the shard
size. A shard is closed before the next tensor would push its data past ``max_shard_bytes`` (a
single tensor larger than the bound is a shard of its own) or its header past the room kept.
``close`` renames the shards to ``model-00001-of-0000N.safetensors`` (the total is known only
then) and writes the index last, through a temporary file and a rename: a directory with the
index is complete, one without it is an export cut short.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import TracebackType
from typing import IO

import torch
from safetensors.torch import load_file

from colossal_contracts import CheckpointError, ConfigError
from colossal_zero.checkpoint import TensorSpec, safetensors_header, tensor_bytes

__all__ = ["HF_INDEX", "ShardedSafetensorsWriter", "load_sharded_safetensors"]

HF_INDEX = "model.safetensors.index.json"
_HEADER_ROOM = 1 << 20  # bytes kept for a shard's header: ~8,000 tensors of 100-character names
_META = {"format": "pt"}


class _OpenShard:
    """The shard being written: its file, the specs in it, its data and header bytes so far."""

    def __init__(self, path: Path, room: int) -> None:
        self.path, self.room = path, room
        self.fh: IO[bytes] = open(path, "wb")  # noqa: SIM115 (closed by finish)
        self.fh.seek(room)
        self.specs: list[TensorSpec] = []
        self.data_bytes = 0
        self.header_bytes = len(safetensors_header([], _META))  # grows by each entry

    def _entry_bytes(self, spec: TensorSpec) -> int:
        """Bytes ``spec`` adds to the JSON header (its entry and a comma)."""
        one = safetensors_header([spec], None)
        return len(one[8:].rstrip()) - 2 + 1 + len(str(self.data_bytes)) * 2

    def header_fits(self, spec: TensorSpec) -> bool:
        return self.header_bytes + self._entry_bytes(spec) + 8 <= self.room

    def append(self, spec: TensorSpec, tensor: torch.Tensor) -> None:
        self.fh.write(tensor_bytes(tensor))
        self.fh.flush()  # its bytes are the OS's now: nothing of it stays in this process
        self.header_bytes += self._entry_bytes(spec)
        self.specs.append(spec)
        self.data_bytes += spec.nbytes

    def finish(self) -> None:
        self.fh.seek(0)
        self.fh.write(safetensors_header(self.specs, _META, size=self.room))
        self.fh.flush()
        os.fsync(self.fh.fileno())
        self.fh.close()


class ShardedSafetensorsWriter:
    """``with ShardedSafetensorsWriter(dir, max_shard_bytes=...) as w: w.add(name, t)``.

    Invariant: the shards hold every added tensor once (contiguous, as given), none holds more
    than ``max_shard_bytes`` of data unless it is one tensor, and the index maps each name to
    its shard. ``add`` writes the tensor's bytes before it returns ([Note: streamed export]).
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
        # headers are ~1% of small shards' room at most, 1 MiB for large ones
        self._room = min(_HEADER_ROOM, max(4096, max_shard_bytes // 64 // 8 * 8))
        self._open: _OpenShard | None = None
        self._shards: list[tuple[Path, list[str]]] = []  # temporary file, names in it
        self._names: set[str] = set()
        self.total_bytes = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        """Write ``tensor`` under ``name`` into the open shard (first closing it when full)."""
        if name in self._names:
            raise ConfigError(f"tensor {name!r} was added twice to the sharded export")
        self._names.add(name)
        spec = TensorSpec.of(name, tensor)
        shard = self._open
        if (
            shard is not None
            and shard.specs
            and (
                shard.data_bytes + spec.nbytes > self.max_shard_bytes or not shard.header_fits(spec)
            )
        ):
            self._flush()
            shard = None
        if shard is None:
            tmp = self.directory / f".{self.prefix}-part{len(self._shards):05d}.tmp"
            shard = self._open = _OpenShard(tmp, self._room)
        if not shard.header_fits(spec):
            raise ConfigError(f"tensor name {name[:80]!r}... is too long for a shard's header")
        shard.append(spec, tensor)
        self.total_bytes += spec.nbytes

    def _flush(self) -> None:
        shard, self._open = self._open, None
        if shard is None:
            return
        shard.finish()
        self._shards.append((shard.path, [s.name for s in shard.specs]))

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
        if self._open is not None:
            self._open.fh.close()
            self._shards.append((self._open.path, []))
            self._open = None
        for tmp, _ in self._shards:
            tmp.unlink(missing_ok=True)
        self._shards = []

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


def load_sharded_safetensors(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the sharded safetensors export in ``directory`` (its ``HF_INDEX``),
    loaded into one dict: for tests and small models (it holds them all)."""
    try:
        weight_map = json.loads((Path(directory) / HF_INDEX).read_text())["weight_map"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise CheckpointError(f"{directory} has no readable {HF_INDEX}: {err}") from err
    out: dict[str, torch.Tensor] = {}
    for shard in sorted(set(weight_map.values())):
        out.update(load_file(str(Path(directory) / shard)))
    return out
