"""Where token ids enter a decoder and where its logits leave, written once for GPT and PaLM
(and their pipeline stages, which call the models' ``embed`` and ``head`` on themselves).

``embed_ids`` checks the ids at the model's door, keeps the ids this rank computes on
(``LMIO.tokens``), embeds them with the model's own lookup and hands the result to
``LMIO.enter``; ``lm_head`` checks and splits the targets the same way and applies the final
norm and the output matrix through ``LMIO.forward`` (logits, or the mean loss).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch
from torch import nn

from ._inputs import check_input_ids, check_token_ids
from ._io import LMIO

__all__ = ["embed_ids", "lm_head"]


class _Vocab(Protocol):
    """What the boundary reads of a model's config."""

    vocab_size: int
    max_seq_len: int


def embed_ids(
    io: LMIO,
    config: _Vocab,
    idx: torch.Tensor,
    lookup: Callable[[torch.Tensor, int], torch.Tensor],
) -> torch.Tensor:
    """Ids ``(B, T)`` to the first block's input ``(B, T, C)``: ``lookup(ids, T)`` embeds the
    ids this rank holds (``T`` is the whole sequence's length, for positions)."""
    check_input_ids(idx, config.vocab_size, config.max_seq_len)
    seq_len = idx.shape[1]
    idx, _ = io.tokens(idx, None)
    return io.enter(lookup(idx, seq_len))


def lm_head(
    io: LMIO,
    config: _Vocab,
    norm: nn.Module,
    weight: torch.Tensor,
    x: torch.Tensor,
    targets: torch.Tensor | None,
) -> torch.Tensor:
    """The last block's output ``x`` to logits ``(B, T, V)`` through ``norm`` and the output
    matrix ``weight (V, C)``, or to the mean loss with ``targets``."""
    if targets is not None:
        check_token_ids(targets, config.vocab_size, what="targets")
        _, targets = io.tokens(targets, targets)
    return io(norm(x), weight, targets)
