"""Choosing the next token from a model's logits: greedy, or sampled with temperature, top-k
and top-p (nucleus) from a seeded generator, so a seed gives the same text every time."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from colossal_contracts import ConfigError

__all__ = ["SamplingConfig", "next_token"]


@dataclass(frozen=True)
class SamplingConfig:
    """How tokens are chosen.

    Attributes:
        max_new_tokens: tokens generated after the prompt (fewer when the model emits its
            end-of-text token).
        temperature: 0 is greedy decoding (the most likely token, as ``transformers``'
            ``do_sample=False``); above 0 the logits are divided by it and a token is sampled.
        top_k: sample only among the k most likely tokens (0: all).
        top_p: sample only among the most likely tokens whose probabilities sum to p (1: all).
        seed: seeds the sampling generator (the same seed gives the same tokens).
    """

    max_new_tokens: int = 64
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.max_new_tokens, bool) or self.max_new_tokens < 1:
            raise ConfigError(f"--max-new-tokens must be positive, got {self.max_new_tokens}")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ConfigError(f"--temperature must be >= 0 (0 is greedy), got {self.temperature}")
        if self.top_k < 0:
            raise ConfigError(f"--top-k must be >= 0 (0: no limit), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"--top-p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def next_token(logits: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator) -> int:
    """The next token id from the last position's logits ``(V,)``."""
    logits = logits.detach().float().cpu()
    if cfg.greedy:
        return int(torch.argmax(logits))
    logits = logits / cfg.temperature
    if cfg.top_k and cfg.top_k < logits.numel():
        kth = torch.topk(logits, cfg.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if cfg.top_p < 1:
        order = torch.argsort(logits, descending=True)
        probs = torch.softmax(logits[order], dim=-1)
        # keep the smallest prefix whose mass reaches top_p (the first token always)
        drop = torch.cumsum(probs, dim=-1) - probs >= cfg.top_p
        logits[order[drop]] = float("-inf")
    probs = torch.softmax(logits, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))
