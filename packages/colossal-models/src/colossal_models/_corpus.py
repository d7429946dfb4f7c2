"""Text corpora as byte tensors, and random training windows over them.

The embedded default is the Python standard library's own source files on the user's machine
(found through ``sysconfig``), so the main job needs no download.
"""

from __future__ import annotations

import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch

from colossal_contracts import ConfigError

__all__ = ["Corpus", "default_corpus_path", "load_corpus"]

_PROBE = 4096  # bytes read to decide whether a file is text


def default_corpus_path() -> Path:
    """The directory of this interpreter's standard library sources."""
    return Path(sysconfig.get_paths()["stdlib"])


def _is_text(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            head = f.read(_PROBE)
    except OSError:
        return False
    if not head or b"\x00" in head:
        return False
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as err:  # a multi-byte char cut at the probe's end is still text
        return err.start >= len(head) - 3
    return True


def _files(root: Path, default: bool) -> list[Path]:
    if root.is_file():
        if not os.access(root, os.R_OK):
            raise ConfigError(
                f"corpus file {root} cannot be read (permission denied); make it readable or "
                "give another --corpus"
            )
        if not _is_text(root):
            raise ConfigError(
                f"corpus file {root} is not text (binary, or not UTF-8); give a text file or a "
                "folder of text files"
            )
        return [root]
    pattern = "*.py" if default else "*"
    skip = {"site-packages", "__pycache__", "test", "tests", "idlelib"} if default else set()
    found = []
    for p in sorted(root.rglob(pattern)):
        if p.is_file() and not skip.intersection(p.relative_to(root).parts) and _is_text(p):
            found.append(p)
    return found


@dataclass(frozen=True)
class Corpus:
    """A corpus as one uint8 tensor of bytes, with where it came from.

    Attributes:
        data: 1-D uint8 tensor; the concatenation of the files' bytes, separated by newlines.
        source: the path it was read from.
        num_files: how many files contributed.
    """

    data: torch.Tensor
    source: Path
    num_files: int

    def split(self, val_fraction: float = 0.05) -> tuple[torch.Tensor, torch.Tensor]:
        """(train, validation) byte tensors; validation is the tail."""
        cut = int(len(self.data) * (1 - val_fraction))
        return self.data[:cut], self.data[cut:]

    def batch(
        self, data: torch.Tensor, batch_size: int, seq_len: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Random windows: inputs (B, T) and next-byte targets (B, T), both int64."""
        if len(data) <= seq_len + 1:
            raise ConfigError(
                f"corpus {self.source} has {len(data)} bytes, too few for --seq-len {seq_len}; "
                "give more text or a shorter sequence"
            )
        starts = torch.randint(0, len(data) - seq_len - 1, (batch_size,), generator=generator)
        windows = torch.stack([data[s : s + seq_len + 1] for s in starts.tolist()]).long()
        return windows[:, :-1], windows[:, 1:]


def load_corpus(path: str | Path | None = None, *, max_bytes: int = 16 << 20) -> Corpus:
    """Read a text file, or every text file under a folder (sorted), up to ``max_bytes``.

    ``path=None`` reads the embedded default. Raises ``ConfigError`` when the path does not exist
    or holds no text.
    """
    default = path is None
    root = default_corpus_path() if default else Path(path).expanduser()
    if not root.exists():
        raise ConfigError(
            f"corpus path {root} does not exist; give a text file or a folder of text"
        )
    files = _files(root, default)
    chunks, total = [], 0
    for f in files:
        raw = f.read_bytes()
        if not raw.strip():
            continue
        chunks.append(raw + b"\n")
        total += len(raw) + 1
        if total >= max_bytes:
            break
    if not chunks:
        raise ConfigError(f"corpus path {root} holds no text (no non-empty UTF-8 file found)")
    blob = b"".join(chunks)[:max_bytes]
    return Corpus(torch.frombuffer(bytearray(blob), dtype=torch.uint8), root, len(chunks))
