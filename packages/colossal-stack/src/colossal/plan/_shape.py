"""The shape of a transformer as the planner sees it, read from a colossal-models preset."""

from __future__ import annotations

from dataclasses import dataclass

from colossal_contracts import ConfigError
from colossal_models import GPTConfig, PaLMConfig

__all__ = ["ModelShape", "gpt_shape", "model_shape"]


@dataclass(frozen=True)
class ModelShape:
    """Sizes of a decoder-only transformer.

    Attributes:
        name: ``family-preset``.
        layers, hidden, heads, vocab: L, h, a, V of Korthikanti et al.
        params: exact parameter count (colossal-models' ``num_params``).
        embed_params: parameters of the embeddings (on the first pipeline stage; tied head).
    """

    name: str
    layers: int
    hidden: int
    heads: int
    vocab: int
    params: int
    embed_params: int

    @property
    def layer_params(self) -> float:
        """Parameters of one transformer block (all blocks are alike)."""
        return (self.params - self.embed_params) / self.layers

    def flops_per_token(self, seq_len: int) -> float:
        """Model FLOPs of forward + backward per token: ``6N + 12 L h s`` (attention scores and
        their use, Narayanan et al. 2021 without the logit term, which ``6N`` already holds)."""
        return 6.0 * self.params + 12.0 * self.layers * self.hidden * seq_len


def gpt_shape(layers: int, hidden: int, heads: int, *, seq_len: int = 2048) -> ModelShape:
    """A GPT of any size (GPT-2 vocabulary, ``seq_len`` learned positions), e.g. for a search of the
    largest model that fits."""
    g = GPTConfig(max_seq_len=seq_len, num_layers=layers, num_heads=heads, hidden_size=hidden)
    embed = (g.vocab_size + g.max_seq_len) * g.hidden_size
    return ModelShape(
        f"gpt-{layers}x{hidden}", layers, hidden, heads, g.vocab_size, g.num_params(), embed
    )


def model_shape(family: str, preset: str) -> ModelShape:
    """The shape of colossal-models' ``family`` (gpt or palm) preset ``preset``."""
    if family == "gpt":
        g = GPTConfig.preset(preset)
        embed = g.vocab_size * g.hidden_size + g.max_seq_len * g.hidden_size
        return ModelShape(
            f"gpt-{preset}",
            g.num_layers,
            g.hidden_size,
            g.num_heads,
            g.vocab_size,
            g.num_params(),
            embed,
        )
    if family == "palm":
        p = PaLMConfig.preset(preset)
        embed = p.vocab_size * p.hidden_size * (1 if p.tie_embeddings else 2)
        return ModelShape(
            preset if preset.startswith(("palm", "llama")) else f"palm-{preset}",
            p.num_layers,
            p.hidden_size,
            p.num_heads,
            p.vocab_size,
            p.num_params(),
            embed,
        )
    raise ConfigError(f"unknown --model {family!r}; choose gpt or palm (hf:PATH is not supported)")
