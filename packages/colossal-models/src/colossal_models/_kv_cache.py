"""``KVCache``: the keys and values of earlier positions, so decoding computes one new token per
step instead of the whole sequence again.

[Note: incremental decoding] ``model(idx, cache=cache)`` runs only the tokens ``idx`` that follow
the ``cache.length`` positions already in the cache: each attention layer appends their keys and
values to its slot and attends over every cached position (causally within ``idx``), positions
start at ``cache.length``, and the model advances the cache by ``idx.shape[1]`` at the end.
The training forward (``cache=None``) runs exactly the code it ran before this path existed.
The cache keeps key/value heads as the layer computes them, before grouped- or multi-query
attention repeats them for the query heads, so a multi-query model caches one head per layer.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from colossal_contracts import ConfigError

__all__ = ["KVCache", "LayerKV", "cached_attention"]


class KVCache:
    """Keys and values of positions ``0..length-1`` for every layer, allocated on first use.

    Attributes:
        max_len: positions the cache can hold (prompt plus generated tokens).
        length: positions held (the next token's position).
    """

    max_len: int
    length: int
    _k: dict[int, torch.Tensor]  # layer -> (B, K, max_len, D)
    _v: dict[int, torch.Tensor]  # layer -> (B, K, max_len, D)

    def __init__(self, max_len: int) -> None:
        if max_len <= 0:
            raise ConfigError(f"KVCache max_len must be positive, got {max_len}")
        self.max_len, self.length = max_len, 0
        self._k, self._v = {}, {}

    def layer(self, index: int) -> LayerKV:
        """The view of layer ``index`` that its attention appends to."""
        return LayerKV(self, index)

    def check_room(self, num_new: int, max_seq_len: int | None = None) -> int:
        """The position of the first of ``num_new`` tokens; ``ConfigError`` if they do not fit
        in the cache or (given) past the model's ``max_seq_len``."""
        if max_seq_len is not None and self.length + num_new > max_seq_len:
            raise ConfigError(
                f"position {self.length + num_new - 1} is past max_seq_len {max_seq_len}; "
                "generate fewer tokens or use a shorter prompt"
            )
        if self.length + num_new > self.max_len:
            raise ConfigError(
                f"the KV cache holds {self.max_len} positions: {self.length} are used and "
                f"{num_new} more do not fit; make a larger KVCache (prompt + new tokens)"
            )
        return self.length

    def advance(self, num_new: int) -> None:
        """Count ``num_new`` positions as held (the model calls it after its last layer)."""
        self.length += num_new

    def bytes(self) -> int:
        """Bytes of the allocated key and value tensors."""
        return sum(t.numel() * t.element_size() for t in (*self._k.values(), *self._v.values()))

    def _append(
        self, index: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        B, K, T, D = k.shape
        if index not in self._k:
            shape = (B, K, self.max_len, D)
            self._k[index] = torch.empty(shape, dtype=k.dtype, device=k.device)
            self._v[index] = torch.empty(shape, dtype=v.dtype, device=v.device)
        end = self.check_room(T) + T
        self._k[index][:, :, self.length : end] = k
        self._v[index][:, :, self.length : end] = v
        return self._k[index][:, :, :end], self._v[index][:, :, :end]


class LayerKV:
    """One layer's slot in a ``KVCache``."""

    def __init__(self, cache: KVCache, index: int) -> None:
        self.cache, self.index = cache, index

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store ``k, v (B, K, T, D)`` after the cached positions; every position's ``k, v``
        ``(B, K, length + T, D)``."""
        return self.cache._append(self.index, k, v)


def cached_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Attention of the last ``Tq`` positions' queries ``(B, H, Tq, D)`` over all ``Tk``
    positions' keys and values ``(B, H, Tk, D)``: query ``i`` sees keys up to ``Tk - Tq + i``."""
    tq, tk = q.shape[2], k.shape[2]
    if tq == tk:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    if tq == 1:
        return F.scaled_dot_product_attention(q, k, v)
    mask = torch.ones(tq, tk, dtype=torch.bool, device=q.device).tril(diagonal=tk - tq)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
