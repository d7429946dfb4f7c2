"""PaLM family (PaLM, and Llama-shaped members): config and presets, model, parallelize plan,
Hugging Face Llama state-dict adapter."""

from .config import PALM_PRESETS, PaLMConfig
from .model import PaLM, PaLMAttention, PaLMBlock, SwiGLU

__all__ = ["PALM_PRESETS", "PaLM", "PaLMAttention", "PaLMBlock", "PaLMConfig", "SwiGLU"]
