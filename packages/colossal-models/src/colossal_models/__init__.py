"""colossal-models: GPT and PaLM built for Colossal, their tensor-parallel plans, Hugging Face
state-dict adapters, a byte tokenizer and corpus loaders; the data path (tokenizers, sources,
token shards, the streaming loader) is the ``colossal_models.data`` subpackage.

Every model folder has the same shape: ``config`` (dataclass and presets), ``model``,
``parallelize`` (tensor-parallel plan) and ``state_dict`` (Hugging Face adapter).
"""

from . import hf, sharding
from ._checkpointing import apply_activation_checkpointing
from ._corpus import default_corpus_path, load_corpus
from ._kv_cache import KVCache
from ._long_seq import apply_sequence_parallel
from ._parallelize import parallelize
from ._stages import PipelineStages, split_into_stages
from ._tokenizer import ByteTokenizer
from .evoformer import EVOFORMER_PRESETS, Evoformer, EvoformerConfig, parallelize_evoformer
from .gpt import GPT, GPT_PRESETS, GPTConfig
from .palm import PALM_PRESETS, PaLM, PaLMConfig

__version__ = "0.1.0"
__all__ = [
    "EVOFORMER_PRESETS",
    "GPT",
    "GPT_PRESETS",
    "PALM_PRESETS",
    "ByteTokenizer",
    "Evoformer",
    "EvoformerConfig",
    "GPTConfig",
    "KVCache",
    "PaLM",
    "PaLMConfig",
    "PipelineStages",
    "apply_activation_checkpointing",
    "apply_sequence_parallel",
    "default_corpus_path",
    "hf",
    "load_corpus",
    "parallelize",
    "parallelize_evoformer",
    "sharding",
    "split_into_stages",
]
