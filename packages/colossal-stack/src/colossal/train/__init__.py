"""The training job behind ``colossal train``."""

from ._config import TrainConfig
from ._loop import TrainResult, build_plugin, train

__all__ = ["TrainConfig", "TrainResult", "build_plugin", "train"]
