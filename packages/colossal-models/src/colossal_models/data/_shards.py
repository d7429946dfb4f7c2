"""Token shards on disk: flat arrays of token ids (uint16, or uint32 for vocabularies past 65536
ids) in ``tokens-NNNNN.bin`` files of at most ``SHARD_TOKENS`` tokens, the end offset of every
document (int64) in ``documents.bin``, and ``index.json`` describing them.

[Note: reading shards] The files are plain arrays, so ``numpy.memmap`` opens them; the loader
reads its windows with ``os.pread`` into small buffers instead of touching a mapping, so streaming
a dataset of any size keeps the process's resident memory flat (a mapping's touched pages count
in RSS until the kernel drops them).
"""

from __future__ import annotations

import contextlib
import json
import os
from bisect import bisect_right
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from colossal_contracts import ConfigError

__all__ = ["INDEX_FILE", "ShardWriter", "TokenShards", "token_dtype"]

INDEX_FILE = "index.json"
DOCS_FILE = "documents.bin"
FORMAT = "colossal-tokens"
VERSION = 1
SHARD_TOKENS = 1 << 29  # 1 GiB of uint16 per shard file


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits, else uint32."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


class ShardWriter:
    """Appends documents' tokens to shard files; ``close`` writes the index last."""

    def __init__(self, directory: Path, dtype: np.dtype, *, shard_tokens: int = SHARD_TOKENS):
        self.directory = directory
        self.dtype = dtype
        self.shard_tokens = shard_tokens
        self.num_tokens = 0
        self.num_documents = 0
        self._shards: list[dict[str, Any]] = []
        self._file: Any = None
        self._in_shard = 0
        self._docs = (directory / DOCS_FILE).open("wb")
        self._doc_ends: list[int] = []

    def add(self, tokens: np.ndarray) -> None:
        """Append ``tokens`` (any integer array) to the stream."""
        tokens = tokens.astype(self.dtype, copy=False)
        while len(tokens):
            if self._file is None or self._in_shard == self.shard_tokens:
                self._next_shard()
            room = self.shard_tokens - self._in_shard
            part, tokens = tokens[:room], tokens[room:]
            self._file.write(part.tobytes())
            self._in_shard += len(part)
            self._shards[-1]["num_tokens"] = self._in_shard
            self.num_tokens += len(part)

    def end_document(self) -> None:
        """Record that the document ends at the current offset."""
        self._doc_ends.append(self.num_tokens)
        self.num_documents += 1
        if len(self._doc_ends) >= 1 << 16:
            self._flush_docs()

    def close(self, meta: dict[str, Any]) -> None:
        """Finish the files and write ``index.json`` (``meta`` plus the shard list)."""
        if self._file is not None:
            self._file.close()
        self._flush_docs()
        self._docs.close()
        index = {
            "format": FORMAT,
            "version": VERSION,
            "dtype": self.dtype.name,
            "num_tokens": self.num_tokens,
            "num_documents": self.num_documents,
            "shards": self._shards,
            **meta,
        }
        (self.directory / INDEX_FILE).write_text(json.dumps(index, indent=2))

    def abort(self) -> None:
        for f in (self._file, self._docs):
            if f is not None and not f.closed:
                f.close()

    def _next_shard(self) -> None:
        if self._file is not None:
            self._file.close()
        name = f"tokens-{len(self._shards):05d}.bin"
        self._file = (self.directory / name).open("wb")
        self._shards.append({"file": name, "num_tokens": 0})
        self._in_shard = 0

    def _flush_docs(self) -> None:
        self._docs.write(np.asarray(self._doc_ends, dtype=np.int64).tobytes())
        self._doc_ends.clear()


@dataclass
class TokenShards:
    """A prepared folder, open for reading (see [Note: reading shards]).

    Attributes:
        directory: the folder.
        index: its parsed ``index.json`` (tokenizer spec, vocab size, end-of-text id, source).
        dtype: the token dtype of the shard files.
        num_tokens: tokens in all shards together (documents and their end-of-text ids).
        num_documents: documents packed.
    """

    directory: Path
    index: dict[str, Any]
    dtype: np.dtype
    num_tokens: int
    num_documents: int
    _starts: list[int]  # first global offset of each shard
    _fds: list[int]
    _docs_fd: int

    @classmethod
    def open(cls, directory: str | Path) -> TokenShards:
        """Open ``directory``; ``ConfigError`` when it is not a complete prepared folder."""
        directory = Path(directory)
        try:
            index = json.loads((directory / INDEX_FILE).read_text())
        except (OSError, ValueError) as err:
            raise ConfigError(
                f"{directory} is not a prepared data folder ({INDEX_FILE}: {err}); make one with "
                "colossal data prepare"
            ) from None
        if not isinstance(index, dict) or index.get("format") != FORMAT:
            raise ConfigError(f"{directory / INDEX_FILE} is not a {FORMAT} index")
        dtype = np.dtype(index["dtype"])
        starts, fds, offset = [], [], 0
        for shard in index["shards"]:
            path = directory / shard["file"]
            size = path.stat().st_size if path.is_file() else -1
            if size != shard["num_tokens"] * dtype.itemsize:
                raise ConfigError(
                    f"shard {path} is missing or has {size} bytes, not "
                    f"{shard['num_tokens'] * dtype.itemsize}; prepare the data again"
                )
            starts.append(offset)
            fds.append(os.open(path, os.O_RDONLY))
            offset += shard["num_tokens"]
        docs_fd = os.open(directory / DOCS_FILE, os.O_RDONLY)
        return cls(
            directory, index, dtype, offset, int(index["num_documents"]), starts, fds, docs_fd
        )

    @property
    def vocab_size(self) -> int:
        return int(self.index["tokenizer"]["vocab_size"])

    def read(self, start: int, stop: int) -> np.ndarray:
        """Tokens ``[start, stop)`` of the whole stream, across shard files, as a new array."""
        out = np.empty(stop - start, dtype=self.dtype)
        view = memoryview(out).cast("B")
        at, item = start, self.dtype.itemsize
        while at < stop:
            i = bisect_right(self._starts, at) - 1
            shard_end = self._starts[i + 1] if i + 1 < len(self._starts) else self.num_tokens
            n = min(stop, shard_end) - at
            lo = (at - start) * item
            got = os.preadv(self._fds[i], [view[lo : lo + n * item]], (at - self._starts[i]) * item)
            if got != n * item:
                raise ConfigError(f"shard {i} of {self.directory} is shorter than its index says")
            at += n
        return out

    def read_windows(self, starts: np.ndarray, length: int) -> np.ndarray:
        """Rows ``[s, s + length)`` for each ``s`` in ``starts``: an ``(n, length)`` array."""
        out = np.empty((len(starts), length), dtype=self.dtype)
        item = self.dtype.itemsize
        shard = np.searchsorted(self._starts, starts, side="right") - 1
        bounds = [*self._starts[1:], self.num_tokens]
        for row, (s, i) in enumerate(zip(starts.tolist(), shard.tolist())):
            if s + length <= bounds[i]:  # inside one file: one pread straight into the row
                want = length * item
                got = os.preadv(self._fds[i], [memoryview(out[row]).cast("B")],
                                (s - self._starts[i]) * item)  # fmt: skip
                if got != want:
                    raise ConfigError(f"shard {i} of {self.directory} is shorter than its index")
            else:
                out[row] = self.read(s, s + length)
        return out

    def document_end(self, i: int) -> int:
        """The end offset (exclusive) of document ``i``."""
        raw = os.pread(self._docs_fd, 8, i * 8)
        return int(np.frombuffer(raw, dtype=np.int64)[0])

    def close(self) -> None:
        """Close the files (also when the object is collected)."""
        for fd in [*self._fds, self._docs_fd]:
            if fd >= 0:
                os.close(fd)
        self._fds, self._docs_fd = [], -1

    def __del__(self) -> None:
        with contextlib.suppress(OSError):
            self.close()
