"""Booster and plugins."""

from ._booster import Booster
from ._checkpoint import latest_checkpoint
from ._ddp import DDPPlugin
from ._gemini import GeminiPlugin, parse_bytes
from ._plugin import Plugin

__all__ = ["Booster", "DDPPlugin", "GeminiPlugin", "Plugin", "latest_checkpoint", "parse_bytes"]
