"""Booster and plugins (and the checkpoint functions users call, from ``colossal.checkpoint``)."""

from .._sizes import parse_bytes
from ..checkpoint import (
    HF_INDEX,
    ShardedSafetensorsWriter,
    explain_no_checkpoint,
    export_checkpoint,
    find_checkpoint,
    iter_full_tensors,
    latest_checkpoint,
    load_layout_checkpoint,
    load_sharded_safetensors,
    read_layout_index,
)
from ._booster import Booster
from ._ddp import DDPPlugin
from ._gemini import GeminiConfig, GeminiPlugin, export_gemini
from ._hybrid import HybridParallelPlugin, PipelineModule
from ._plugin import Plugin
from ._zero import LowLevelZeroPlugin

__all__ = [
    "HF_INDEX",
    "Booster",
    "DDPPlugin",
    "GeminiConfig",
    "GeminiPlugin",
    "HybridParallelPlugin",
    "LowLevelZeroPlugin",
    "PipelineModule",
    "Plugin",
    "ShardedSafetensorsWriter",
    "explain_no_checkpoint",
    "export_checkpoint",
    "export_gemini",
    "find_checkpoint",
    "iter_full_tensors",
    "latest_checkpoint",
    "load_layout_checkpoint",
    "load_sharded_safetensors",
    "parse_bytes",
    "read_layout_index",
]
