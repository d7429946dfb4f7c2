"""``colossal plan``: will a model fit, with which layout, how fast, and on how many devices.

A paper model (see docs/plan.md): the runtime's per-device peak (Korthikanti et al.'s activation
count with fused attention, the fp32 loss terms, ZeRO's model-state bytes), validated against
measured per-rank peaks at small scale; colossal-parallel's counted communication bytes over
given bandwidths, the pipeline bubble and offload traffic over PCIe and disk. Models: colossal's
GPT/PaLM presets or a Hugging Face causal LM's local ``config.json``.
"""

from ._activation import (
    ATTENTION,
    RECOMPUTE,
    head_activation_bytes,
    layer_activation_bytes,
    logits_bytes,
)
from ._cost import StepCost, step_cost
from ._hardware import HARDWARE, Hardware, parse_bandwidth, parse_bytes
from ._layout import METHODS, TP_MODES, Layout, enumerate_layouts
from ._lora import lora_params, lora_shape
from ._memory import PRECISIONS, MemoryBreakdown, device_memory
from ._search import Plan, PlanRequest, evaluate, fewest_devices, plan_layouts
from ._shape import ModelShape, from_gpt_config, from_palm_config, gpt_shape, model_shape

__all__ = [
    "ATTENTION",
    "HARDWARE",
    "METHODS",
    "PRECISIONS",
    "RECOMPUTE",
    "TP_MODES",
    "Hardware",
    "Layout",
    "MemoryBreakdown",
    "ModelShape",
    "Plan",
    "PlanRequest",
    "StepCost",
    "device_memory",
    "enumerate_layouts",
    "evaluate",
    "fewest_devices",
    "from_gpt_config",
    "from_palm_config",
    "gpt_shape",
    "head_activation_bytes",
    "layer_activation_bytes",
    "logits_bytes",
    "lora_params",
    "lora_shape",
    "model_shape",
    "parse_bandwidth",
    "parse_bytes",
    "plan_layouts",
    "step_cost",
]
