"""GPT-2 style model: config and presets, model."""

from .config import GPT_PRESETS, GPTConfig
from .model import GPT, MLP, Block, CausalSelfAttention

__all__ = ["GPT", "GPT_PRESETS", "MLP", "Block", "CausalSelfAttention", "GPTConfig"]
