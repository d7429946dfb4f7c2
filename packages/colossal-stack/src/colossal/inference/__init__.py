"""Generating text: a key/value cache for GPT and PaLM (and Hugging Face models' own), greedy
and seeded sampling, and offloaded inference that streams the weights through Gemini's chunks
under an accelerator budget."""

from ._decoders import Decoder, HFDecoder, NativeDecoder
from ._generate import GenerationResult, build_decoder, generate, generate_ids, offload
from ._load import Loaded, TextCodec, load_for_generation
from ._sampling import SamplingConfig, next_token

__all__ = [
    "Decoder",
    "GenerationResult",
    "HFDecoder",
    "Loaded",
    "NativeDecoder",
    "SamplingConfig",
    "TextCodec",
    "build_decoder",
    "generate",
    "generate_ids",
    "load_for_generation",
    "next_token",
    "offload",
]
