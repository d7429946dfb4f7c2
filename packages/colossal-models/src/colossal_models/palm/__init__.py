"""PaLM family (PaLM, and Llama-shaped members): config and presets, model, tensor-parallel
plan, Hugging Face Llama state-dict adapter."""

from .config import PALM_PRESETS, PaLMConfig
from .model import PaLM, PaLMAttention, PaLMBlock, SwiGLU
from .parallelize import parallelize_palm
from .state_dict import LlamaStateDictAdapter

__all__ = [
    "PALM_PRESETS",
    "LlamaStateDictAdapter",
    "PaLM",
    "PaLMAttention",
    "PaLMBlock",
    "PaLMConfig",
    "SwiGLU",
    "parallelize_palm",
]
