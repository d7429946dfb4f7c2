"""PaLM configuration: a flat dataclass and the named presets, from test sizes to PaLM 540B.

The family is PaLM's (Chowdhery et al., 2022): rotary positions, SwiGLU, no biases, multi-query
attention, and attention and MLP computed in parallel from one norm. Four switches make the same
code Llama-shaped, which is what the Hugging Face Llama adapter maps onto (see ``state_dict.py``):
``parallel_block=False`` (sequential attention then MLP, two norms), ``num_kv_heads`` (grouped-query
attention), ``norm="rmsnorm"`` and ``tie_embeddings=False``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

from colossal_contracts import ConfigError

__all__ = ["PALM_PRESETS", "PaLMConfig"]

NormKind = Literal["layernorm", "rmsnorm"]


@dataclass(frozen=True)
class PaLMConfig:
    """Shape of a PaLM-family decoder (no biases anywhere, rotary positions, SwiGLU MLP).

    Attributes:
        vocab_size: tokens in the vocabulary (256 for the byte tokenizer, 256k for PaLM).
        max_seq_len: longest input accepted (rotary positions have no table, this is a guard).
        num_layers: transformer blocks.
        num_heads: query heads.
        num_kv_heads: key/value heads; 1 is multi-query attention (PaLM), ``num_heads`` is plain
            multi-head attention; must divide ``num_heads``.
        hidden_size: width of the residual stream (d_model).
        head_dim: width of one head; ``None`` means hidden_size // num_heads. PaLM 540B uses 256
            with 48 heads and d_model 18432, so heads * head_dim need not equal hidden_size.
        ffn_hidden_size: SwiGLU inner width; ``None`` means 4 * hidden_size, as in PaLM.
        parallel_block: ``x + attn(n(x)) + mlp(n(x))`` with one norm (PaLM), else the sequential
            ``x + attn(n1(x))`` then ``+ mlp(n2(.))`` (Llama).
        norm: "layernorm" (PaLM, without bias) or "rmsnorm" (Llama).
        norm_eps: epsilon of the norms.
        tie_embeddings: the output head is the token embedding (PaLM) or its own matrix (Llama).
        rope_theta: rotary base.
    """

    vocab_size: int = 256000
    max_seq_len: int = 2048
    num_layers: int = 32
    num_heads: int = 16
    num_kv_heads: int = 1
    hidden_size: int = 4096
    head_dim: int | None = None
    ffn_hidden_size: int | None = None
    parallel_block: bool = True
    norm: NormKind = "layernorm"
    norm_eps: float = 1e-5
    tie_embeddings: bool = True
    rope_theta: float = 10000.0

    def __post_init__(self) -> None:
        for name in (
            "vocab_size",
            "max_seq_len",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "hidden_size",
        ):
            if getattr(self, name) <= 0:
                raise ConfigError(f"PaLMConfig.{name} must be positive, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"PaLMConfig: num_kv_heads {self.num_kv_heads} must divide num_heads "
                f"{self.num_heads}; use 1 (multi-query) or a divisor of num_heads"
            )
        if self.head_dim is None and self.hidden_size % self.num_heads:
            raise ConfigError(
                f"PaLMConfig: hidden_size {self.hidden_size} is not divisible by num_heads "
                f"{self.num_heads}; pick a head count that divides it or set head_dim"
            )
        if self.head_size % 2:
            raise ConfigError(
                f"PaLMConfig: rotary embeddings need an even head_dim, got {self.head_size}"
            )
        if self.norm not in ("layernorm", "rmsnorm"):
            raise ConfigError(
                f"PaLMConfig.norm must be 'layernorm' or 'rmsnorm', got {self.norm!r}"
            )

    @property
    def head_size(self) -> int:
        """The width of one head (``head_dim`` resolved)."""
        return self.head_dim or self.hidden_size // self.num_heads

    @property
    def ffn_size(self) -> int:
        return self.ffn_hidden_size or 4 * self.hidden_size

    def num_params(self) -> int:
        """Exact parameter count of ``PaLM(self)`` (tied head counted once)."""
        h, f, d = self.hidden_size, self.ffn_size, self.head_size
        attn = h * self.num_heads * d * 2 + h * self.num_kv_heads * d * 2  # q, proj; k, v
        norms = h if self.parallel_block else 2 * h
        per_block = attn + 3 * h * f + norms
        head = 0 if self.tie_embeddings else self.vocab_size * h
        return self.vocab_size * h + head + self.num_layers * per_block + h

    def with_vocab(self, vocab_size: int) -> PaLMConfig:
        return replace(self, vocab_size=vocab_size)

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> PaLMConfig:
        """The named preset, with fields replaced by ``overrides``; ``ConfigError`` if unknown."""
        if name not in PALM_PRESETS:
            raise ConfigError(
                f"unknown PaLM preset {name!r}; choose one of: {', '.join(PALM_PRESETS)}"
            )
        return replace(PALM_PRESETS[name], **overrides)


_BYTES = 256
PALM_PRESETS: dict[str, PaLMConfig] = {
    # Test and demo sizes: byte vocabulary, short context.
    "nano": PaLMConfig(
        vocab_size=_BYTES, max_seq_len=64, num_layers=2, num_heads=2, hidden_size=64
    ),
    "micro": PaLMConfig(
        vocab_size=_BYTES, max_seq_len=128, num_layers=2, num_heads=4, hidden_size=128
    ),
    "tiny": PaLMConfig(
        vocab_size=_BYTES, max_seq_len=256, num_layers=4, num_heads=4, hidden_size=256
    ),
    "mini": PaLMConfig(
        vocab_size=_BYTES, max_seq_len=512, num_layers=6, num_heads=8, hidden_size=512
    ),
    # PaLM (Chowdhery et al., 2022, table 1): 256k SentencePiece vocabulary, head_dim 256.
    "palm-8b": PaLMConfig(num_layers=32, num_heads=16, hidden_size=4096, head_dim=256),
    "palm-62b": PaLMConfig(num_layers=64, num_heads=32, hidden_size=8192, head_dim=256),
    "palm-540b": PaLMConfig(num_layers=118, num_heads=48, hidden_size=18432, head_dim=256),
    # Llama 2 7B (Touvron et al., 2023) as a member of this family: what the HF adapter maps.
    "llama-7b": PaLMConfig(
        vocab_size=32000,
        max_seq_len=4096,
        num_layers=32,
        num_heads=32,
        num_kv_heads=32,
        hidden_size=4096,
        ffn_hidden_size=11008,
        parallel_block=False,
        norm="rmsnorm",
        norm_eps=1e-5,
        tie_embeddings=False,
    ),
}
