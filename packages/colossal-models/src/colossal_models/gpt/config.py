"""GPT configuration: a flat dataclass and the named presets, from test sizes to GPT-3 175B.

Presets only describe shapes, so planning tools (memory estimates, chunk plans) can talk about models
far too large to allocate here. ``GPTConfig.preset("tiny")`` is what the main job trains.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from colossal_contracts import ConfigError

__all__ = ["GPT_PRESETS", "GPTConfig"]


@dataclass(frozen=True)
class GPTConfig:
    """Shape of a GPT-2 style model (learned positions, pre-LayerNorm, GELU MLP, tied embeddings).

    Attributes:
        vocab_size: tokens in the vocabulary (256 for the byte tokenizer, 50257 for GPT-2's BPE).
        max_seq_len: positions in the learned position table; longer inputs are an error.
        num_layers: transformer blocks.
        num_heads: attention heads; must divide ``hidden_size``.
        hidden_size: width of the residual stream (d_model).
        ffn_hidden_size: MLP inner width; ``None`` means 4 * hidden_size, as in GPT-2.
        dropout: on embeddings, attention output and MLP output (0 keeps runs exactly repeatable).
        bias: biases in Linear and LayerNorm (GPT-2 has them).
        layer_norm_eps: LayerNorm epsilon (GPT-2 uses 1e-5).
    """

    vocab_size: int = 50257
    max_seq_len: int = 1024
    num_layers: int = 12
    num_heads: int = 12
    hidden_size: int = 768
    ffn_hidden_size: int | None = None
    dropout: float = 0.0
    bias: bool = True
    layer_norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        for name in ("vocab_size", "max_seq_len", "num_layers", "num_heads", "hidden_size"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"GPTConfig.{name} must be positive, got {getattr(self, name)}")
        if self.hidden_size % self.num_heads:
            raise ConfigError(
                f"GPTConfig: hidden_size {self.hidden_size} is not divisible by num_heads "
                f"{self.num_heads}; pick a head count that divides it"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"GPTConfig.dropout must be in [0, 1), got {self.dropout}")

    @property
    def ffn_size(self) -> int:
        return self.ffn_hidden_size or 4 * self.hidden_size

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def num_params(self) -> int:
        """Exact parameter count of ``GPT(self)`` (tied head counted once)."""
        h, f, b = self.hidden_size, self.ffn_size, int(self.bias)
        per_block = (
            2 * (h + h * b)  # ln1, ln2
            + h * 3 * h
            + 3 * h * b  # qkv
            + h * h
            + h * b  # attention out
            + h * f
            + f * b
            + f * h
            + h * b  # mlp
        )
        embed = self.vocab_size * h + self.max_seq_len * h
        return embed + self.num_layers * per_block + h + h * b

    def with_vocab(self, vocab_size: int) -> GPTConfig:
        return replace(self, vocab_size=vocab_size)

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> GPTConfig:
        """The named preset, with fields replaced by ``overrides``; ``ConfigError`` if unknown."""
        if name not in GPT_PRESETS:
            raise ConfigError(
                f"unknown GPT preset {name!r}; choose one of: {', '.join(GPT_PRESETS)}"
            )
        return replace(GPT_PRESETS[name], **overrides)


_BYTES = 256
GPT_PRESETS: dict[str, GPTConfig] = {
    # Test and demo sizes: byte vocabulary, short context.
    "nano": GPTConfig(vocab_size=_BYTES, max_seq_len=64, num_layers=2, num_heads=2, hidden_size=64),
    "micro": GPTConfig(
        vocab_size=_BYTES, max_seq_len=128, num_layers=2, num_heads=4, hidden_size=128
    ),
    "tiny": GPTConfig(
        vocab_size=_BYTES, max_seq_len=256, num_layers=4, num_heads=4, hidden_size=256
    ),
    "mini": GPTConfig(
        vocab_size=_BYTES, max_seq_len=512, num_layers=6, num_heads=8, hidden_size=512
    ),
    # GPT-2 (Radford et al., 2019).
    "small": GPTConfig(num_layers=12, num_heads=12, hidden_size=768),
    "medium": GPTConfig(num_layers=24, num_heads=16, hidden_size=1024),
    "large": GPTConfig(num_layers=36, num_heads=20, hidden_size=1280),
    "xl": GPTConfig(num_layers=48, num_heads=25, hidden_size=1600),
    # GPT-3 (Brown et al., 2020), 2048-token context. 13B uses 5120 (the paper's 5140 is a typo).
    "2.7b": GPTConfig(max_seq_len=2048, num_layers=32, num_heads=32, hidden_size=2560),
    "6.7b": GPTConfig(max_seq_len=2048, num_layers=32, num_heads=32, hidden_size=4096),
    "13b": GPTConfig(max_seq_len=2048, num_layers=40, num_heads=40, hidden_size=5120),
    "175b": GPTConfig(max_seq_len=2048, num_layers=96, num_heads=96, hidden_size=12288),
}
