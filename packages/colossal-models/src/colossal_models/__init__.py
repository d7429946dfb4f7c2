"""colossal-models: GPT and PaLM built for Colossal, their tensor-parallel plans, Hugging Face
state-dict adapters, a byte tokenizer and corpus loaders; the data path (tokenizers, sources,
token shards, the streaming loader) is the ``colossal_models.data`` subpackage.

Every model folder has the same shape: ``config`` (dataclass and presets), ``model``,
``parallelize`` (tensor-parallel plan) and ``state_dict`` (Hugging Face adapter).
"""

from ._attention import CausalAttention
from ._checkpointing import apply_activation_checkpointing
from ._corpus import Corpus, default_corpus_path, load_corpus
from ._gather import all_shard_maps, gather_full_state_dict, gather_full_tensor, stream_full_state
from ._hf_load import (
    HF_TP_ADAPTERS,
    HFCausalLM,
    check_hf_sizes,
    from_hf,
    hf_adapter_config,
    hf_lazy_sources,
    hf_max_positions,
    hf_num_params,
    hf_state_adapter,
    load_hf_causal_lm,
    load_hf_config,
)
from ._io import LMIO
from ._kv_cache import KVCache
from ._long_seq import apply_sequence_parallel
from ._parallelize import parallelize
from ._shard_map import Box, Piece, ShardMap, flat_range_boxes, shard_map
from ._sharding import describe_sharding
from ._stages import PipelineStages, split_into_stages
from ._tokenizer import ByteTokenizer
from .evoformer import EVOFORMER_PRESETS, Evoformer, EvoformerConfig, parallelize_evoformer
from .gpt import GPT, GPT_PRESETS, GPT2StateDictAdapter, GPTConfig
from .palm import PALM_PRESETS, LlamaStateDictAdapter, PaLM, PaLMConfig

__version__ = "0.1.0"
__all__ = [
    "EVOFORMER_PRESETS",
    "GPT",
    "GPT_PRESETS",
    "HF_TP_ADAPTERS",
    "LMIO",
    "PALM_PRESETS",
    "Box",
    "ByteTokenizer",
    "CausalAttention",
    "Corpus",
    "Evoformer",
    "EvoformerConfig",
    "GPT2StateDictAdapter",
    "GPTConfig",
    "HFCausalLM",
    "KVCache",
    "LlamaStateDictAdapter",
    "PaLM",
    "PaLMConfig",
    "Piece",
    "PipelineStages",
    "ShardMap",
    "all_shard_maps",
    "apply_activation_checkpointing",
    "apply_sequence_parallel",
    "check_hf_sizes",
    "default_corpus_path",
    "describe_sharding",
    "flat_range_boxes",
    "from_hf",
    "gather_full_state_dict",
    "gather_full_tensor",
    "hf_adapter_config",
    "hf_lazy_sources",
    "hf_max_positions",
    "hf_num_params",
    "hf_state_adapter",
    "load_corpus",
    "load_hf_causal_lm",
    "load_hf_config",
    "parallelize",
    "parallelize_evoformer",
    "shard_map",
    "split_into_stages",
    "stream_full_state",
]
