"""A byte-level tokenizer: every UTF-8 byte is a token, so any text has a lossless encoding."""

from __future__ import annotations

import torch

__all__ = ["ByteTokenizer"]


class ByteTokenizer:
    """Tokens are the 256 byte values. Invariant: ``decode(encode(s)) == s`` for every str."""

    vocab_size: int = 256

    def encode(self, text: str) -> torch.Tensor:
        """1-D int64 tensor of the UTF-8 bytes of ``text``."""
        return torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8).long()

    def decode(self, ids: torch.Tensor | list[int]) -> str:
        """Text of ``ids``; byte sequences that are not valid UTF-8 decode to U+FFFD."""
        data = bytes(int(i) for i in (ids.tolist() if isinstance(ids, torch.Tensor) else ids))
        return data.decode("utf-8", errors="replace")
