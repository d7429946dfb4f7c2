"""The training job behind ``colossal train``."""

from ._config import TrainConfig
from ._guard import NonFiniteError
from ._loop import TrainResult, build_plugin, train

__all__ = ["NonFiniteError", "TrainConfig", "TrainResult", "build_plugin", "train"]
