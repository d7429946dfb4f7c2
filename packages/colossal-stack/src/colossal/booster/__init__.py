"""Booster and plugins."""

from ._booster import Booster
from ._ddp import DDPPlugin
from ._gemini import GeminiPlugin, parse_bytes
from ._hybrid import HybridParallelPlugin, PipelineModule
from ._plugin import Plugin
from ._publish import find_checkpoint, latest_checkpoint
from ._zero import LowLevelZeroPlugin

__all__ = [
    "Booster",
    "DDPPlugin",
    "GeminiPlugin",
    "HybridParallelPlugin",
    "LowLevelZeroPlugin",
    "PipelineModule",
    "Plugin",
    "find_checkpoint",
    "latest_checkpoint",
    "parse_bytes",
]
