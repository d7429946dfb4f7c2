"""LoRA through Hugging Face ``peft``: which layers (``resolve_targets``), the wrap
(``apply_lora``), the base fingerprint a resume is checked against, and the adapter and merged
exports of a LoRA checkpoint (``export_adapter``, ``merged_state``); under 1d tensor
parallelism the adapters are sharded beside their base (``parallelize_lora``, and
``lora_shard_maps`` for what each rank holds of the unsharded adapters)."""

from ._apply import LoraSpec, apply_lora, base_fingerprint, check_lora_optimizer, lora_layers
from ._targets import LORA_GROUPS, linear_layers, resolve_targets
from ._tp import lora_shard_maps, parallelize_lora

__all__ = [
    "LORA_GROUPS",
    "LoraSpec",
    "apply_lora",
    "base_fingerprint",
    "check_lora_optimizer",
    "linear_layers",
    "lora_layers",
    "lora_shard_maps",
    "parallelize_lora",
    "resolve_targets",
]
