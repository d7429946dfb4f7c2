"""Safetensors files written as a stream: the header first, then each tensor's bytes in turn.

[Note: streamed safetensors] A safetensors file is an 8-byte little-endian header length, a JSON
header (per tensor its dtype, shape and ``data_offsets`` into the data that follows; the format
allows trailing spaces as padding) and the tensors' bytes. When every tensor's name, dtype and
shape are known before any value is read (a Gemini shard: its chunk records), the header is
computed first and each value is written straight from its storage (CPU tensors are not copied;
others are copied to the host one tensor at a time) and hashed on the way, so the writer never
holds more than the tensor it is handed and the file's SHA-256 needs no second read. Reading
back is the mirror image: ``SafetensorsRangeReader`` parses the header and ``pread``s an element
range of a tensor straight into the caller's storage (a chunk's shard): no mapping of the file,
no intermediate tensor.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import torch

from colossal_contracts import CheckpointError

__all__ = [
    "SafetensorsRangeReader",
    "SafetensorsStream",
    "TensorSpec",
    "safetensors_header",
    "tensor_bytes",
]

_HEADER_MAX = 100 << 20  # safetensors' own bound on a header

_DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of a safetensors file: its name, dtype and shape."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * self.dtype.itemsize

    @classmethod
    def of(cls, name: str, tensor: torch.Tensor) -> TensorSpec:
        return cls(name, tensor.dtype, tuple(tensor.shape))


def safetensors_header(
    specs: Sequence[TensorSpec], metadata: Mapping[str, str] | None = None, *, size: int = 0
) -> bytes:
    """The 8-byte length and JSON header of a file holding ``specs`` in order, padded with
    spaces to a multiple of 8 bytes, or to exactly ``size`` bytes (length field included) when
    ``size`` is given; ``ValueError`` when it does not fit in ``size``."""
    table: dict[str, Any] = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for s in specs:
        if s.dtype not in _DTYPES:
            raise CheckpointError(f"tensor {s.name!r} has dtype {s.dtype}, not one safetensors has")
        table[s.name] = {
            "dtype": _DTYPES[s.dtype],
            "shape": list(s.shape),
            "data_offsets": [offset, offset + s.nbytes],
        }
        offset += s.nbytes
    body = json.dumps(table, separators=(",", ":")).encode()
    want = size - 8 if size else len(body) + (-len(body) % 8)
    if len(body) > want:
        raise ValueError(f"a header of {len(body)} bytes does not fit in {want}")
    return struct.pack("<Q", want) + body + b" " * (want - len(body))


def tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """The raw bytes of ``tensor`` (row-major), without a copy when it is a contiguous CPU
    tensor; otherwise from one host copy of it."""
    t = tensor.detach()
    if t.device.type != "cpu" or not t.is_contiguous():
        t = t.contiguous().cpu()
    flat = t.reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.view(torch.uint8)
    return memoryview(flat.view(torch.uint8).numpy())


class SafetensorsStream:
    """``with SafetensorsStream(path, specs) as s: s.write(t0); s.write(t1); ...``

    Invariant: tensors arrive in the order of ``specs`` with their dtype and shape; the file
    holds exactly those bytes after the header; ``digest`` (after ``close``) is the file's
    ``{"sha256", "bytes"}``, as ``file_digest`` would compute it. See [Note: streamed
    safetensors].
    """

    def __init__(
        self, path: Path, specs: Sequence[TensorSpec], metadata: Mapping[str, str] | None = None
    ) -> None:
        self.path = Path(path)
        self._specs = list(specs)
        self._next = 0
        self._hash = hashlib.sha256()
        self._fh = open(self.path, "wb")  # noqa: SIM115 (closed by close or __exit__)
        self._put(memoryview(safetensors_header(self._specs, metadata)))
        self.digest: dict[str, Any] | None = None

    def _put(self, data: memoryview) -> None:
        self._fh.write(data)
        self._hash.update(data)

    def write(self, tensor: torch.Tensor) -> None:
        """Append the next tensor's bytes; ``CheckpointError`` when it is not the one declared."""
        if self._next >= len(self._specs):
            raise CheckpointError(f"{self.path}: more tensors written than declared")
        spec = self._specs[self._next]
        if tensor.dtype != spec.dtype or tuple(tensor.shape) != spec.shape:
            raise CheckpointError(
                f"{self.path}: tensor {spec.name!r} was declared {spec.dtype} {list(spec.shape)}, "
                f"got {tensor.dtype} {list(tensor.shape)}"
            )
        self._put(tensor_bytes(tensor))
        self._next += 1

    def close(self) -> dict[str, Any]:
        """Flush and fsync the file; returns its digest. Every declared tensor must be written."""
        if self.digest is not None:
            return self.digest
        if self._next != len(self._specs):
            self._fh.close()
            raise CheckpointError(
                f"{self.path}: {len(self._specs) - self._next} declared tensors were not written"
            )
        self._fh.flush()
        os.fsync(self._fh.fileno())
        size = self._fh.tell()
        self._fh.close()
        self.digest = {"sha256": self._hash.hexdigest(), "bytes": size}
        return self.digest

    def __enter__(self) -> SafetensorsStream:
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
            self._fh.close()


class SafetensorsRangeReader:
    """Element ranges of the tensors of one safetensors file, read into given storage.

    ``CheckpointError`` naming the file when its header is unreadable or inconsistent with its
    size. The file stays open until ``close``."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        try:
            self._fh = open(self.path, "rb")  # noqa: SIM115 (closed by close)
        except OSError as err:
            raise CheckpointError(
                f"shard file {self.path} is missing or unreadable: {err}"
            ) from err
        try:
            self._table, self._data = self._parse()
        except CheckpointError:
            self._fh.close()
            raise

    def _parse(self) -> tuple[dict[str, Any], int]:
        size = os.fstat(self._fh.fileno()).st_size
        head = self._fh.read(8)
        n = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
        bad = CheckpointError(f"shard file {self.path} is corrupt (not a safetensors file)")
        if not 0 < n <= min(_HEADER_MAX, size - 8):
            raise bad
        try:
            table = json.loads(self._fh.read(n))
        except (UnicodeDecodeError, ValueError) as err:
            raise bad from err
        if not isinstance(table, dict):
            raise bad
        table.pop("__metadata__", None)
        names = {v: k for k, v in _DTYPES.items()}
        for entry in table.values():
            ok = isinstance(entry, dict) and entry.get("dtype") in names
            offsets = entry.get("data_offsets") if ok else None
            if not (
                isinstance(offsets, list)
                and len(offsets) == 2
                and 0 <= offsets[0] <= offsets[1] <= size - 8 - n
            ):
                raise bad
            entry["dtype"] = names[entry["dtype"]]
        return table, 8 + n

    def keys(self) -> set[str]:
        return set(self._table)

    def numel(self, key: str) -> int | None:
        """Elements of the tensor ``key`` as its header says; None when absent."""
        entry = self._table.get(key)
        if entry is None:
            return None
        n = 1
        for d in entry.get("shape", []):
            n *= int(d)
        return n

    def read_into(self, key: str, start: int, out: torch.Tensor) -> None:
        """Elements ``[start, start + out.numel())`` of the flattened ``key`` into ``out`` (a
        contiguous CPU tensor of the file's dtype; others go through one host copy)."""
        entry = self._table[key]
        dst = out
        if out.device.type != "cpu" or not out.is_contiguous() or out.dtype != entry["dtype"]:
            dst = torch.empty(out.shape, dtype=entry["dtype"])
        size = dst.element_size()
        lo, hi = entry["data_offsets"]
        offset = self._data + lo + start * size
        if offset + dst.numel() * size > self._data + hi:
            raise CheckpointError(f"{self.path}: {key} has fewer elements than the index says")
        view = memoryview(dst.reshape(-1).view(torch.uint8).numpy())
        done = 0
        while done < len(view):
            got = os.preadv(self._fh.fileno(), [view[done:]], offset + done)
            if got <= 0:
                raise CheckpointError(f"{self.path} ended early reading {key}")
            done += got
        if dst is not out:
            out.copy_(dst)

    def get(self, key: str) -> torch.Tensor:
        """The whole tensor ``key``."""
        entry = self._table[key]
        out = torch.empty(entry["shape"], dtype=entry["dtype"])
        self.read_into(key, 0, out)
        return out

    def close(self) -> None:
        self._fh.close()
