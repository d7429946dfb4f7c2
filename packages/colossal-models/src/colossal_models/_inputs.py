"""Checking token ids at a model's door: the right dtype and inside the vocabulary.

Without it a float tensor or an id past ``vocab_size`` fails deep inside ``nn.Embedding`` or the
loss with an index error (or, on CUDA, a device-side assert); with it the message names the
offending value and the model's vocabulary.
"""

from __future__ import annotations

import torch

from colossal_contracts import ConfigError

__all__ = ["check_input_ids", "check_token_ids"]

IGNORE_INDEX = -100  # targets equal to it are left out of the loss (cross-entropy's default)


def check_token_ids(ids: torch.Tensor, vocab_size: int, *, what: str = "input ids") -> None:
    """``ConfigError`` unless ``ids`` is an integer tensor with every value in ``[0,
    vocab_size)`` (targets may also hold ``IGNORE_INDEX``)."""
    if not isinstance(ids, torch.Tensor):
        raise ConfigError(f"{what} must be a torch.Tensor of token ids, got {type(ids).__name__}")
    if ids.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8):
        raise ConfigError(
            f"{what} must be integer token ids (torch.long), got {ids.dtype}; mixed precision "
            "applies to the model's weights, not to its token ids"
        )
    if ids.dim() != 2:
        raise ConfigError(f"{what} must have shape (batch, seq_len), got {tuple(ids.shape)}")
    if ids.numel() == 0 or ids.is_meta:  # meta tensors (static estimates) have no values
        return
    valid = (ids >= 0) & (ids < vocab_size)
    if what == "targets":
        valid |= ids == IGNORE_INDEX
    if not bool(valid.all()):
        bad = ids[~valid][0].item()
        raise ConfigError(
            f"{what} hold the id {bad}, outside the vocabulary [0, {vocab_size}); check the "
            "tokenizer matches the model's vocab_size"
        )


def check_input_ids(ids: torch.Tensor, vocab_size: int, max_seq_len: int) -> None:
    """``check_token_ids`` for a model's input, and ``ConfigError`` when the sequence is longer
    than ``max_seq_len``."""
    check_token_ids(ids, vocab_size)
    if max_seq_len < ids.shape[1]:
        raise ConfigError(
            f"sequence length {ids.shape[1]} exceeds max_seq_len {max_seq_len}; "
            "use a shorter --seq-len or a preset with a longer context"
        )
