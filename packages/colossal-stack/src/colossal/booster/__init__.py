"""Booster and plugins."""

from ._booster import Booster
from ._ddp import DDPPlugin
from ._gemini import GeminiPlugin, parse_bytes
from ._plugin import Plugin
from ._publish import find_checkpoint, latest_checkpoint

__all__ = [
    "Booster",
    "DDPPlugin",
    "GeminiPlugin",
    "Plugin",
    "find_checkpoint",
    "latest_checkpoint",
    "parse_bytes",
]
