"""What the hybrid plugin does first with a ``peft`` (LoRA) model: a Hugging Face one converted
to our GPT or PaLM ([Note: Hugging Face LoRA under tp] in ``colossal.lora``), and the layouts
LoRA does not train on refused before any process group."""

from __future__ import annotations

from dataclasses import replace

from torch import nn

from colossal_contracts import ConfigError
from colossal_zero import LazyInit

from .._capability import Combination, check_combination
from ..lora._apply import has_lora
from ..lora._hf_tp import hf_lora_to_ours

__all__ = ["prepare_lora"]


def prepare_lora(
    model: nn.Module, combination: Combination, *, what: str, lazy: LazyInit | None
) -> tuple[nn.Module, dict[str, str] | None, bool]:
    """``(model to shard, the user's names of its trainable parameters or None for its own,
    whether it carries LoRA)``; ``ConfigError`` (one line) for LoRA on a layout without a rule
    (``combination`` with ``lora``, see the capability table) or on a lazily built model."""
    converted = hf_lora_to_ours(model)
    names = None
    if converted is not None:
        model, names = converted.model, converted.names
    lora = has_lora(model)
    if lora:
        what = f"LoRA on {what}"
        check_combination(replace(combination, lora=True), what=what)
        if lazy is not None:
            raise ConfigError(f"{what}: peft wraps real weights; build the model without lazy_init")
    return model, names, lora
