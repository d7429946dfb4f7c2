"""GPT-2 style model: config and presets, model, tensor-parallel plan, Hugging Face adapter."""

from .config import GPT_PRESETS, GPTConfig
from .model import GPT, MLP, Block, CausalSelfAttention
from .parallelize import parallelize_gpt
from .state_dict import GPT2StateDictAdapter

__all__ = [
    "GPT",
    "GPT_PRESETS",
    "MLP",
    "Block",
    "CausalSelfAttention",
    "GPT2StateDictAdapter",
    "GPTConfig",
    "parallelize_gpt",
]
