"""Raw data prepared on first use: a content-keyed folder under a cache root, reused after.

The key digests the source (path, kind, text field, cap, and every file's size and mtime) and
the tokenizer's fingerprint, so edited data or another tokenizer prepares afresh.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from colossal_contracts import ConfigError

from ._prepare import prepare_data
from ._shards import INDEX_FILE, TokenShards
from ._sources import TextSource
from ._tokenizers import TextTokenizer

__all__ = ["cache_root", "cached_data", "is_prepared"]


def cache_root() -> Path:
    """``$COLOSSAL_CACHE/data``, else ``~/.cache/colossal/data`` (XDG_CACHE_HOME honoured)."""
    env = os.environ.get("COLOSSAL_CACHE")
    if env:
        return Path(env).expanduser() / "data"
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "colossal" / "data"


def is_prepared(path: str | Path | None) -> bool:
    """Whether ``path`` is a folder made by ``prepare_data``."""
    return path is not None and (Path(path).expanduser() / INDEX_FILE).is_file()


def _key(source: TextSource, tokenizer: TextTokenizer) -> str:
    root = source.path
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    h = hashlib.sha256()
    h.update(json.dumps([str(root.resolve()), source.kind, source.text_field, source.max_bytes,
                         tokenizer.fingerprint]).encode())  # fmt: skip
    for f in files:
        st = f.stat()
        h.update(f"{f}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:20]


def cached_data(
    source: TextSource, tokenizer: TextTokenizer, *, root: Path | None = None
) -> TokenShards:
    """``source`` prepared with ``tokenizer``: the cached folder when one exists, else prepared
    into the cache now (atomically; a concurrent preparer of the same key is tolerated)."""
    folder = (root or cache_root()) / f"{source.path.name or 'data'}-{_key(source, tokenizer)}"
    if is_prepared(folder):
        return TokenShards.open(folder)
    try:
        return prepare_data(source, tokenizer, folder)
    except ConfigError:
        if is_prepared(folder):  # another process finished it first
            return TokenShards.open(folder)
        raise
    except OSError as err:
        if is_prepared(folder):
            return TokenShards.open(folder)
        raise ConfigError(
            f"cannot prepare {source.path} into the cache {folder.parent} ({err}); set "
            "COLOSSAL_CACHE to a writable folder, or run colossal data prepare first"
        ) from None
