"""``colossal tokenizer train`` and ``colossal data prepare``: text to a tokenizer, text to
token shards (colossal-models' ``data`` package)."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from colossal_contracts import ConfigError
from colossal_models.data import load_tokenizer, open_source, prepare_data, train_tokenizer

__all__ = ["add_data_parsers"]


def add_data_parsers(sub: argparse._SubParsersAction) -> None:
    tok = sub.add_parser("tokenizer", help="train a tokenizer")
    tok_sub = tok.add_subparsers(dest="tokenizer_command", required=True)
    train = tok_sub.add_parser(
        "train", help="train a byte-level BPE tokenizer on local text (offline)"
    )
    train.add_argument("--corpus", "--data", dest="data", type=Path, required=True,
                       help="text file or folder, .jsonl, .parquet or a saved dataset folder")  # fmt: skip
    train.add_argument("--vocab-size", type=int, required=True, help="ids, <|endoftext|> included")
    train.add_argument("--out", type=Path, required=True, help="folder for tokenizer.json")
    train.add_argument("--text-field", default="text", help="jsonl key / column of the text")
    train.set_defaults(func=_train_tokenizer)

    data = sub.add_parser("data", help="prepare a dataset")
    data_sub = data.add_subparsers(dest="data_command", required=True)
    prep = data_sub.add_parser(
        "prepare", help="tokenize a dataset once, in parallel, into token shards"
    )
    prep.add_argument("--tokenizer", default="bytes", help="bytes or hf:PATH (default: bytes)")
    prep.add_argument("--data", "--corpus", dest="data", type=Path, required=True,
                      help="text file or folder, .jsonl, .parquet or a saved dataset folder")  # fmt: skip
    prep.add_argument("--out", type=Path, required=True, help="new folder for the shards")
    prep.add_argument("--text-field", default="text", help="jsonl key / column of the text")
    prep.add_argument("--workers", type=int, default=None,
                      help="tokenizing processes (default: one per CPU, up to 8)")  # fmt: skip
    prep.set_defaults(func=_prepare)


def _train_tokenizer(args: argparse.Namespace) -> int:
    out: Path = args.out
    if (out / "tokenizer.json").exists():
        raise ConfigError(f"--out {out} holds a tokenizer.json already; give a new folder")
    source = open_source(args.data, text_field=args.text_field)
    texts = (piece.text for piece in source.pieces())
    tok = train_tokenizer(texts, vocab_size=args.vocab_size, out=out)
    Console(stderr=True).print(
        f"wrote {out / 'tokenizer.json'} ({tok.vocab_size:,} ids); train with --tokenizer hf:{out}"
    )
    return 0


def _prepare(args: argparse.Namespace) -> int:
    if args.workers is not None and args.workers < 1:
        raise ConfigError(f"--workers must be positive, got {args.workers}")
    tokenizer = load_tokenizer(args.tokenizer)
    source = open_source(args.data, text_field=args.text_field)
    shards = prepare_data(source, tokenizer, args.out, num_workers=args.workers)
    Console(stderr=True).print(
        f"wrote {args.out}: {shards.num_tokens:,} tokens ({shards.dtype.name}) of "
        f"{shards.num_documents:,} documents in {len(shards.index['shards'])} shard(s); train "
        f"with --data {args.out}"
    )
    return 0
