"""The planner's shape of a LoRA run: the base frozen, the adapters of rank r trainable.

The adapters are counted on the model itself, built on the meta device (no memory, no weights):
``colossal.lora.lora_layers`` picks the linear layers as the job does, and each adapted
layer of ``in -> out`` features adds ``r * (in + out)`` trainable parameters (``lora_A`` and
``lora_B``), so a fused ``qkv`` and separate ``q``, ``k``, ``v`` projections are each counted
as they are built.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from colossal_contracts import ConfigError
from colossal_models import GPT, GPTConfig, PaLM, PaLMConfig
from colossal_models.hf import load_hf_causal_lm

from ..lora import LoraSpec, linear_layers, lora_layers
from ._shape import ModelShape

__all__ = ["lora_params", "lora_shape"]


def _meta_model(model: str, preset: str) -> nn.Module:
    with torch.device("meta"):
        if model == "gpt":
            return GPT(GPTConfig.preset(preset))
        if model == "palm":
            return PaLM(PaLMConfig.preset(preset))
        if model.startswith("hf:"):
            return load_hf_causal_lm(model[3:])
    raise ConfigError(f"unknown --model {model!r}; choose gpt, palm or hf:PATH")


def lora_params(module: nn.Module, spec: LoraSpec, *, label: str) -> int:
    """Trainable parameters LoRA ``spec`` adds to ``module``; ``ConfigError`` as the job's
    (targets that match nothing, a rank above a layer's width)."""
    names = lora_layers(module, spec, label=label)
    widths = linear_layers(module)
    return sum(spec.rank * (widths[n][0] + widths[n][1]) for n in names)


def lora_shape(shape: ModelShape, model: str, preset: str, spec: LoraSpec) -> ModelShape:
    """``shape`` (of ``model`` at ``preset``) trained with LoRA ``spec``: the base's
    parameters frozen, the adapters' added and trainable."""
    adapters = lora_params(_meta_model(model, preset), spec, label=shape.name)
    return replace(
        shape,
        name=f"{shape.name} + LoRA r{spec.rank}",
        params=shape.params + adapters,
        frozen=shape.params,
    )
