"""LoRA through Hugging Face ``peft``: which layers (``resolve_targets``), the wrap
(``apply_lora``), the base fingerprint a resume is checked against, and the adapter and merged
exports of a LoRA checkpoint (``export_adapter``, ``merged_state``); under 1d tensor
parallelism the adapters are sharded beside their base (``parallelize_lora``, and
``lora_shard_maps`` for what each rank holds of the unsharded adapters), a Hugging Face
model's ``peft`` model first converted to our GPT or PaLM (``hf_lora_to_ours``)."""

from ._apply import LoraSpec, apply_lora, base_fingerprint, check_lora_optimizer, lora_layers
from ._hf_tp import ConvertedLora, hf_lora_to_ours
from ._targets import LORA_GROUPS, linear_layers, resolve_targets
from ._tp import lora_shard_maps, parallelize_lora

__all__ = [
    "LORA_GROUPS",
    "ConvertedLora",
    "LoraSpec",
    "apply_lora",
    "base_fingerprint",
    "check_lora_optimizer",
    "hf_lora_to_ours",
    "linear_layers",
    "lora_layers",
    "lora_shard_maps",
    "parallelize_lora",
    "resolve_targets",
]
