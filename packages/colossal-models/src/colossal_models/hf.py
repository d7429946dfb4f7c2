"""Hugging Face interop: load a local ``config.json`` or saved folder (no download) as itself
(``HFCausalLM``, lazily from its safetensors tensor by tensor) or as our GPT/PaLM through the
state-dict adapters of GPT-2 and Llama, and size checks before any weight is read."""

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
from .gpt import GPT2StateDictAdapter
from .palm import LlamaStateDictAdapter

__all__ = [
    "HF_TP_ADAPTERS",
    "GPT2StateDictAdapter",
    "HFCausalLM",
    "LlamaStateDictAdapter",
    "check_hf_sizes",
    "from_hf",
    "hf_adapter_config",
    "hf_lazy_sources",
    "hf_max_positions",
    "hf_num_params",
    "hf_state_adapter",
    "load_hf_causal_lm",
    "load_hf_config",
]
