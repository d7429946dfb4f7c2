"""Booster and plugins."""

from ._booster import Booster
from ._checkpoint import latest_checkpoint
from ._ddp import DDPPlugin
from ._plugin import Plugin

__all__ = ["Booster", "DDPPlugin", "Plugin", "latest_checkpoint"]
