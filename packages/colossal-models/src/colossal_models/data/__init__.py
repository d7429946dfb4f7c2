"""Text in, token batches out: tokenizers (bytes or Hugging Face ``tokenizers``), sources (text,
jsonl, parquet, saved ``datasets`` folders), ``prepare_data`` into memory-mappable token shards,
and a resumable streaming ``TokenLoader`` with one slice per data-parallel rank.
"""

from ._cache import cache_root, cached_data, is_prepared
from ._loader import DataState, TokenLoader
from ._prepare import prepare_data
from ._shards import TokenShards, token_dtype
from ._sources import TextSource, open_source
from ._tokenizers import (
    BYTES,
    EOT_TOKEN,
    HFTokenizer,
    TextTokenizer,
    TokenizerBytes,
    has_tokenizer,
    load_tokenizer,
    tokenizer_file,
    train_tokenizer,
)

__all__ = [
    "BYTES",
    "EOT_TOKEN",
    "DataState",
    "HFTokenizer",
    "TextSource",
    "TextTokenizer",
    "TokenLoader",
    "TokenShards",
    "TokenizerBytes",
    "cache_root",
    "cached_data",
    "has_tokenizer",
    "is_prepared",
    "load_tokenizer",
    "open_source",
    "prepare_data",
    "token_dtype",
    "tokenizer_file",
    "train_tokenizer",
]
