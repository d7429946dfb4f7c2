"""Booster and plugins."""

from ._booster import Booster
from ._ddp import DDPPlugin
from ._export import export_checkpoint
from ._gemini import GeminiPlugin, export_gemini, parse_bytes
from ._hybrid import HybridParallelPlugin, PipelineModule
from ._hybrid_checkpoint import iter_full_tensors, load_layout_checkpoint, read_layout_index
from ._plugin import Plugin
from ._publish import explain_no_checkpoint, find_checkpoint, latest_checkpoint
from ._shard_writer import HF_INDEX, ShardedSafetensorsWriter, load_sharded_safetensors
from ._zero import LowLevelZeroPlugin

__all__ = [
    "HF_INDEX",
    "Booster",
    "DDPPlugin",
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
