"""The job's tokenizer and data: chosen from the flags, checked before anything is written, and
streamed with a position the checkpoint records (colossal-models' ``data`` package does the work).

The tokenizer is ``--tokenizer`` when given; else a prepared ``--data`` folder's own; else the
``--model hf:PATH`` folder's tokenizer when it has one (tokenizer.json, or vocab.json and
merges.txt); else the byte tokenizer. Raw data is prepared on first use into a cache (rank 0
first, the others then find it), so a bad file is one error on every rank and nothing
half-written is left.
"""

from __future__ import annotations

from pathlib import Path

import torch.distributed as dist

from colossal_contracts import ConfigError
from colossal_models.data import (
    BYTES,
    TextTokenizer,
    TokenLoader,
    TokenShards,
    cached_data,
    has_tokenizer,
    is_prepared,
    load_tokenizer,
    open_source,
)

from ._config import TrainConfig
from ._models import HF_PREFIX

__all__ = ["describe_data", "open_data", "open_loader", "resolve_tokenizer"]


def resolve_tokenizer(cfg: TrainConfig) -> TextTokenizer:
    """The run's tokenizer (see the module's docstring for the order of choice)."""
    if cfg.data.tokenizer is not None:
        return load_tokenizer(cfg.data.tokenizer)
    path = cfg.data.path
    if path is not None and is_prepared(path):
        folder = Path(path).expanduser()
        return load_tokenizer(f"hf:{folder}" if has_tokenizer(folder) else BYTES)
    if cfg.model.name.startswith(HF_PREFIX):
        path = Path(cfg.model.name[len(HF_PREFIX) :]).expanduser()
        folder = path if path.is_dir() else path.parent
        if has_tokenizer(folder):
            return load_tokenizer(f"hf:{folder}")
    return load_tokenizer(BYTES)


def open_data(cfg: TrainConfig, tokenizer: TextTokenizer, *, rank: int) -> TokenShards:
    """The prepared shards of ``cfg.data.path`` (raw data: prepared into the cache now, rank 0 first);
    ``ConfigError`` on every rank for bad data, or a prepared folder of another tokenizer."""
    path = cfg.data.path
    if path is not None and is_prepared(path):
        shards = TokenShards.open(Path(path).expanduser())
        made_by = shards.index["tokenizer"]
        if made_by["fingerprint"] != tokenizer.fingerprint:
            raise ConfigError(
                f"--data {cfg.data.path} was prepared with the tokenizer {made_by['spec']}, not "
                f"{tokenizer.spec}; drop --tokenizer (the folder's own is used) or prepare the "
                "data again with this one"
            )
        return shards
    source = open_source(cfg.data.path, text_field=cfg.data.text_field)
    distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    if not distributed:
        return cached_data(source, tokenizer)
    failure: list[str | None] = [None]
    shards = None
    if rank == 0:
        try:
            shards = cached_data(source, tokenizer)
        except ConfigError as err:
            failure[0] = str(err)
    dist.broadcast_object_list(failure, src=0)
    if failure[0] is not None:
        raise ConfigError(failure[0])
    return shards if shards is not None else cached_data(source, tokenizer)


def open_loader(
    cfg: TrainConfig, shards: TokenShards, *, dp_rank: int = 0, dp_size: int = 1
) -> TokenLoader:
    """The run's loader over ``shards``: ``batch_size * grad_accum`` sequences per step and
    dp rank (the micro-batches of one step are consecutive rows); ``ConfigError`` when the data
    is shorter than one sequence (training or held out)."""
    return TokenLoader(
        shards,
        seq_len=cfg.data.seq_len,
        batch_size=cfg.data.batch_size * cfg.training.grad_accum,
        dp_rank=dp_rank,
        dp_size=dp_size,
        seed=cfg.training.seed,
        val_fraction=cfg.data.val_fraction,
    )


def describe_data(shards: TokenShards, tokenizer: TextTokenizer) -> str:
    """One phrase for the run's banner."""
    return (
        f"data {shards.index.get('source', shards.directory)} ({shards.num_tokens:,} tokens, "
        f"{shards.num_documents:,} documents, tokenizer {tokenizer.spec})"
    )
