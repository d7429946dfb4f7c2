"""colossal-models: GPT and friends built for Colossal, a byte tokenizer and corpus loaders."""

from ._corpus import Corpus, default_corpus_path, load_corpus
from ._tokenizer import ByteTokenizer
from .gpt import GPT, GPT_PRESETS, GPTConfig

__version__ = "0.1.0"
__all__ = [
    "GPT",
    "GPT_PRESETS",
    "ByteTokenizer",
    "Corpus",
    "GPTConfig",
    "default_corpus_path",
    "load_corpus",
]
