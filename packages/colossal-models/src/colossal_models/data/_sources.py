"""Where text comes from: a text file or folder, ``.jsonl``, ``.parquet`` or a saved Hugging Face
``datasets`` folder, read as a stream of pieces of documents (no size cap, nothing held whole).

A text file is one document (read in pieces cut at line ends); a jsonl line, a parquet row or a
dataset row is one document (its ``text_field``). A folder is read file by file in sorted order
(binary files inside it are skipped, as are files of no text). Every problem is a one-line
``ConfigError`` naming the file (and the jsonl line) and the fix.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from colossal_contracts import ConfigError

if TYPE_CHECKING:
    import datasets

from .._corpus import _files, _is_text, default_corpus_path

__all__ = ["Piece", "TextSource", "open_source"]

_PIECE = 1 << 20  # characters per piece of a long text file
_HF_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")
_JSONL = (".jsonl", ".ndjson")


@dataclass(frozen=True)
class Piece:
    """Text of one document, or one piece of it; ``last`` closes the document."""

    text: str
    last: bool


@dataclass(frozen=True)
class TextSource:
    """A checked data path: what it is and how to read it.

    Attributes:
        path: the file or folder (the standard library sources for the default).
        kind: "text", "jsonl", "parquet", "hf-dataset" or "folder".
        text_field: the jsonl key / column holding the text.
        max_bytes: stop after about this many bytes of text (the embedded default only); None: all.
    """

    path: Path
    kind: str
    text_field: str = "text"
    max_bytes: int | None = None

    def pieces(self) -> Iterator[Piece]:
        """Every document's text in order, in pieces of at most about 1 MiB."""
        total = 0
        for piece in _read(self.path, self.kind, self.text_field, self.max_bytes is not None):
            yield piece
            total += len(piece.text)
            if self.max_bytes is not None and total >= self.max_bytes and piece.last:
                return


def open_source(
    path: str | Path | None, *, text_field: str = "text", max_default_bytes: int = 16 << 20
) -> TextSource:
    """Check ``path`` (None: the embedded default, this Python's standard library, capped at
    ``max_default_bytes``) before any reading: it exists, has a known kind, a parquet file or
    dataset has the column, a lone file is text."""
    if path is None:
        return TextSource(default_corpus_path(), "folder", text_field, max_default_bytes)
    root = Path(path).expanduser()
    if not root.exists():
        raise ConfigError(
            f"data path {root} does not exist; give a text file or folder, .jsonl, .parquet or "
            "a saved Hugging Face dataset folder"
        )
    if root.is_dir():
        if any((root / m).is_file() for m in _HF_MARKERS):
            _hf_dataset(root, text_field)  # checks the column
            return TextSource(root, "hf-dataset", text_field)
        return TextSource(root, "folder", text_field)
    kind = _kind(root)
    if kind == "parquet":
        _parquet_column(root, text_field)
    elif kind == "text" and not _is_text(root):
        raise ConfigError(
            f"data file {root} is not text (binary, or not UTF-8); give a text file, .jsonl, "
            ".parquet or a folder of text files"
        )
    return TextSource(root, kind, text_field)


def _kind(path: Path) -> str:
    if path.suffix in _JSONL:
        return "jsonl"
    if path.suffix == ".parquet":
        return "parquet"
    return "text"


def _read(path: Path, kind: str, field: str, default: bool) -> Iterator[Piece]:
    if kind == "folder":
        for f in _folder_files(path, default):
            yield from _read(f, _kind(f), field, default)
    elif kind == "text":
        yield from _text_pieces(path)
    elif kind == "jsonl":
        yield from _jsonl(path, field)
    elif kind == "parquet":
        yield from _parquet(path, field)
    else:
        for row in _hf_dataset(path, field):
            yield Piece(_field_text(row, field, path), True)


def _folder_files(root: Path, default: bool) -> list[Path]:
    """The files of a folder in sorted order: jsonl and parquet by name, others when text."""
    if default:
        return _files(root, True)
    return [
        p
        for p in sorted(root.rglob("*"))
        if p.is_file()
        and not any(part.startswith(".") for part in p.relative_to(root).parts)
        and (_kind(p) != "text" or _is_text(p))
    ]


def _text_pieces(path: Path) -> Iterator[Piece]:
    """A text file as one document: pieces cut after a newline near every 1 MiB."""
    with path.open(encoding="utf-8", errors="strict", newline="") as f:
        pending, started = "", False
        while True:
            try:
                block = f.read(_PIECE)
            except UnicodeDecodeError as err:
                raise ConfigError(f"data file {path} is not UTF-8 text ({err.reason})") from None
            if not block:
                break
            if "\x00" in block:
                raise ConfigError(f"data file {path} holds a NUL byte: it is binary, not text")
            pending += block
            cut = pending.rfind("\n") + 1
            if cut and len(pending) >= _PIECE:
                yield Piece(pending[:cut], False)
                pending, started = pending[cut:], True
        if started or pending.strip():  # a file of only whitespace is no document
            yield Piece(pending, True)


def _jsonl(path: Path, field: str) -> Iterator[Piece]:
    with path.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw)
            except (ValueError, UnicodeDecodeError) as err:
                raise ConfigError(
                    f"{path} line {number} is not JSON ({type(err).__name__}: "
                    f"{str(err).splitlines()[0]}); each line must be one JSON object"
                ) from None
            yield Piece(_field_text(row, field, path, number), True)


def _field_text(row: object, field: str, path: Path, line: int | None = None) -> str:
    where = f"{path} line {line}" if line is not None else f"a row of {path}"
    if not isinstance(row, dict) or field not in row:
        keys = ", ".join(sorted(row)) if isinstance(row, dict) else type(row).__name__
        raise ConfigError(
            f"{where} has no {field!r} field (it has: {keys}); pass --text-field NAME"
        )
    text = row[field]
    if not isinstance(text, str):
        raise ConfigError(f"{where}: field {field!r} is {type(text).__name__}, not text")
    return text


def _parquet_column(path: Path, field: str) -> None:
    import pyarrow.parquet as pq

    try:
        names = pq.read_schema(path).names
    except Exception as err:  # pyarrow's ArrowInvalid and OSError alike
        raise ConfigError(f"{path} is not a readable parquet file ({err})") from None
    if field not in names:
        raise ConfigError(
            f"parquet file {path} has no text column {field!r} (columns: {', '.join(names)}); "
            "pass --text-field NAME"
        )


def _parquet(path: Path, field: str) -> Iterator[Piece]:
    """Row groups read one batch at a time (pyarrow, which ``datasets`` uses underneath): no
    copy of the file into a cache."""
    import pyarrow.parquet as pq

    _parquet_column(path, field)
    for batch in pq.ParquetFile(path).iter_batches(batch_size=1024, columns=[field]):
        for text in batch.column(0).to_pylist():
            if not isinstance(text, str):
                raise ConfigError(f"a row of {path}: column {field!r} holds {text!r}, not text")
            yield Piece(text, True)


def _hf_dataset(path: Path, field: str) -> datasets.Dataset:
    """A folder written by ``datasets``' ``save_to_disk`` (its ``train`` split for a
    DatasetDict), memory-mapped by ``datasets``."""
    try:
        import datasets
    except ImportError:
        raise ConfigError(
            f"{path} is a saved Hugging Face dataset; install the data extra "
            "(pip install 'colossal-models[data]') to read it"
        ) from None
    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as err:  # datasets raises several kinds for a damaged folder
        raise ConfigError(f"{path} is not a readable saved dataset ({err})") from None
    if isinstance(ds, datasets.DatasetDict):
        if "train" not in ds:
            raise ConfigError(f"dataset {path} has no 'train' split (it has: {', '.join(ds)})")
        ds = ds["train"]
    if field not in ds.column_names:
        raise ConfigError(
            f"dataset {path} has no text column {field!r} (columns: "
            f"{', '.join(ds.column_names)}); pass --text-field NAME"
        )
    return ds.select_columns([field])
