"""Decoders: one model behind ``start(prompt ids) -> logits`` and ``step(id) -> logits``, with
or without a key/value cache.

``NativeDecoder`` drives our GPT and PaLM through ``colossal_models.KVCache`` ([Note:
incremental decoding] there); ``HFDecoder`` drives a ``transformers`` causal LM through its own
cache (``past_key_values``). Without a cache each step runs the whole sequence again (the last
``max_positions`` tokens), which is what the cache saves. Either may be Gemini-wrapped
(``offload``): the call goes through the wrapper, so its chunks stream in for every forward.
"""

from __future__ import annotations

import inspect
from typing import Any, Protocol

import torch
from torch import nn

from colossal_contracts import ConfigError
from colossal_models import KVCache

__all__ = ["Decoder", "HFDecoder", "NativeDecoder", "check_length"]


class Decoder(Protocol):
    """Logits of the next token after the prompt, then after each token fed to ``step``."""

    max_positions: int

    def start(self, ids: list[int]) -> torch.Tensor:
        """Run the prompt; logits ``(V,)`` of the token after it."""
        ...

    def step(self, token: int) -> torch.Tensor:
        """Append ``token``; logits ``(V,)`` of the token after it."""
        ...


def _ids(ids: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor([ids], dtype=torch.long, device=device)  # (1, T)


class NativeDecoder:
    """Our GPT or PaLM (``call`` is the model or its Gemini wrapper; ``model`` the module)."""

    def __init__(self, call: nn.Module, model: nn.Module, *, use_cache: bool, budget: int) -> None:
        self.call, self.use_cache = call, use_cache
        self.max_positions = int(model.config.max_seq_len)
        self.device = next(model.parameters()).device
        self._cache = KVCache(min(budget, self.max_positions)) if use_cache else None
        self._seq: list[int] = []

    def start(self, ids: list[int]) -> torch.Tensor:
        self._seq = list(ids)
        return self._run(ids)

    def step(self, token: int) -> torch.Tensor:
        self._seq.append(token)
        return self._run([token])

    def _run(self, new: list[int]) -> torch.Tensor:
        if self._cache is not None:
            return self.call(_ids(new, self.device), cache=self._cache)[0, -1]
        window = self._seq[-self.max_positions :]
        return self.call(_ids(window, self.device))[0, -1]


class HFDecoder:
    """A ``transformers`` causal LM (``call`` is the model or its Gemini wrapper)."""

    def __init__(self, call: nn.Module, model: nn.Module, *, use_cache: bool) -> None:
        self.call, self.use_cache = call, use_cache
        cfg = model.config
        limit = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", 0)
        self.max_positions = int(limit or 1 << 30)
        self.device = next(model.parameters()).device
        self._past: Any = None
        self._seq: list[int] = []
        # transformers 5 renamed past_key_values to cache (argument and output field)
        params = inspect.signature(type(model).forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"

    def start(self, ids: list[int]) -> torch.Tensor:
        self._seq, self._past = list(ids), None
        return self._run(ids)

    def step(self, token: int) -> torch.Tensor:
        self._seq.append(token)
        return self._run([token])

    def _run(self, new: list[int]) -> torch.Tensor:
        if self.use_cache:
            past = {self._cache_arg: self._past}
            out = self.call(input_ids=_ids(new, self.device), use_cache=True, **past)
            self._past = out[self._cache_arg]
        else:
            window = self._seq[-self.max_positions :]
            out = self.call(input_ids=_ids(window, self.device), use_cache=False)
        return out.logits[0, -1]


def check_length(decoder: Decoder, prompt_len: int, max_new_tokens: int) -> None:
    """``ConfigError`` when a cached decode would run past the model's positions."""
    if prompt_len == 0:
        raise ConfigError("the prompt is empty; give some text with --prompt")
    total = prompt_len + max_new_tokens
    if getattr(decoder, "use_cache", False) and total > decoder.max_positions:
        raise ConfigError(
            f"the prompt ({prompt_len} tokens) and --max-new-tokens {max_new_tokens} make "
            f"{total} positions, more than the model's {decoder.max_positions}; shorten them"
        )
