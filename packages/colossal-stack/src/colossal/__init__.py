"""Colossal: train models far larger than accelerator memory on one machine, and scale them out.

The meta-package wires the micro-packages together: ``Booster`` and its plugins, the training job,
and the ``colossal`` command.
"""

from ._lazy import lazy_init
from ._peers import RankFailedError
from .booster import (
    Booster,
    DDPPlugin,
    GeminiPlugin,
    HybridParallelPlugin,
    LowLevelZeroPlugin,
    Plugin,
    export_checkpoint,
    latest_checkpoint,
    load_layout_checkpoint,
)
from .export import export_hf
from .inference import generate
from .train import NonFiniteError, TrainConfig, TrainResult, build_plugin, train

__version__ = "0.1.0"
__all__ = [
    "Booster",
    "DDPPlugin",
    "GeminiPlugin",
    "HybridParallelPlugin",
    "LowLevelZeroPlugin",
    "NonFiniteError",
    "Plugin",
    "RankFailedError",
    "TrainConfig",
    "TrainResult",
    "build_plugin",
    "export_checkpoint",
    "export_hf",
    "generate",
    "latest_checkpoint",
    "lazy_init",
    "load_layout_checkpoint",
    "train",
]
