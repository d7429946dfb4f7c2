"""LoRA through Hugging Face ``peft``: which layers (``resolve_targets``), the wrap
(``apply_lora``), the base fingerprint a resume is checked against, and the adapter and merged
exports of a LoRA checkpoint (``export_adapter``, ``merged_state``)."""

from ._apply import LoraSpec, apply_lora, base_fingerprint, check_lora_optimizer, lora_layers
from ._targets import LORA_GROUPS, linear_layers, resolve_targets

__all__ = [
    "LORA_GROUPS",
    "LoraSpec",
    "apply_lora",
    "base_fingerprint",
    "check_lora_optimizer",
    "linear_layers",
    "lora_layers",
    "resolve_targets",
]
