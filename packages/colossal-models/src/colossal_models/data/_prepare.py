"""Tokenize a text source once, in parallel processes, into token shards (``_shards``).

Documents are packed in source order, each followed by the tokenizer's end-of-text id (see
[Note: end of text]). The folder is built under a temporary name beside ``out`` and renamed into
place when complete, so a failure (a bad jsonl line a million lines in) leaves nothing behind and
a reader never sees half a folder.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import tempfile
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path

import numpy as np

from colossal_contracts import ConfigError

from ._shards import ShardWriter, TokenShards, token_dtype
from ._sources import Piece, TextSource
from ._tokenizers import HFTokenizer, TextTokenizer, TokenizerBytes, load_tokenizer

__all__ = ["prepare_data"]

_BATCH_CHARS = 4 << 20  # text handed to one worker task

_worker_tok: TextTokenizer | None = None


def _init_worker(spec: str) -> None:
    global _worker_tok
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one process, one thread: we parallelize
    _worker_tok = load_tokenizer(spec)


def _encode(texts: list[str]) -> list[np.ndarray]:
    assert _worker_tok is not None
    return [np.asarray(ids, dtype=np.uint32) for ids in _worker_tok.encode_batch(texts)]


def _batches(pieces: Iterator[Piece]) -> Iterator[list[Piece]]:
    batch: list[Piece] = []
    size = 0
    for piece in pieces:
        batch.append(piece)
        size += len(piece.text)
        if size >= _BATCH_CHARS:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _encoded(
    source: TextSource, tokenizer: TextTokenizer, num_workers: int
) -> Iterator[tuple[np.ndarray, bool]]:
    """(tokens, closes a document) per piece, in source order."""
    if isinstance(tokenizer, TokenizerBytes):  # memcpy-speed: no worker would pay for itself
        for piece in source.pieces():
            yield np.frombuffer(piece.text.encode("utf-8"), dtype=np.uint8), piece.last
        return
    if num_workers <= 1:
        for batch in _batches(source.pieces()):
            for piece, ids in zip(batch, tokenizer.encode_batch([p.text for p in batch])):
                yield np.asarray(ids, dtype=np.uint32), piece.last
        return
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    with ProcessPoolExecutor(
        num_workers,
        mp_context=multiprocessing.get_context(method),
        initializer=_init_worker,
        initargs=(tokenizer.spec,),
    ) as pool:
        pending: deque[tuple[list[Piece], Future]] = deque()
        for batch in _batches(source.pieces()):
            pending.append((batch, pool.submit(_encode, [p.text for p in batch])))
            if len(pending) >= 2 * num_workers:  # bounded look-ahead: memory stays flat
                yield from _drain(pending.popleft())
        while pending:
            yield from _drain(pending.popleft())


def _drain(item: tuple[list[Piece], Future]) -> Iterator[tuple[np.ndarray, bool]]:
    batch, future = item
    for piece, ids in zip(batch, future.result()):
        yield ids, piece.last


def prepare_data(
    source: TextSource,
    tokenizer: TextTokenizer,
    out: str | Path,
    *,
    num_workers: int | None = None,
) -> TokenShards:
    """Tokenize ``source`` with ``tokenizer`` into the new folder ``out``; return it opened.

    ``num_workers``: tokenizing processes (None: up to 8, one per CPU; in a daemonic process,
    which may not start any, the batches are encoded in this one). ``ConfigError`` when
    ``out`` exists already, and for every problem of the source (nothing is left written).
    """
    out = Path(out).expanduser()
    if out.exists():
        raise ConfigError(f"--out {out} exists already; give a new folder (or delete it)")
    workers = num_workers if num_workers is not None else min(8, os.cpu_count() or 1)
    if multiprocessing.current_process().daemon:  # may start no workers: encode in process
        workers = 1
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    writer = ShardWriter(tmp, token_dtype(tokenizer.vocab_size))
    try:
        eot = np.array([tokenizer.eot_id])
        in_doc = 0  # tokens of the open document: an empty document adds no end-of-text
        for ids, last in _encoded(source, tokenizer, workers):
            writer.add(ids)
            in_doc += len(ids)
            if last and in_doc:
                writer.add(eot)
                writer.end_document()
                in_doc = 0
            elif last:
                in_doc = 0
        if writer.num_documents == 0:
            raise ConfigError(
                f"data path {source.path} holds no text (no non-empty document found); give "
                "a text file or folder, .jsonl, .parquet or a saved dataset with text"
            )
        if isinstance(tokenizer, HFTokenizer):
            tokenizer.save(tmp)
        writer.close(
            {
                "tokenizer": {
                    "spec": tokenizer.spec,
                    "fingerprint": tokenizer.fingerprint,
                    "vocab_size": tokenizer.vocab_size,
                    "eot_id": tokenizer.eot_id,
                },
                "source": str(source.path),
                "kind": source.kind,
                "text_field": source.text_field,
            }
        )
        os.replace(tmp, out)
    except BaseException:
        writer.abort()
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return TokenShards.open(out)
