"""colossal-contracts: the shared interfaces that let each Colossal package be adopted alone."""

from ._errors import (
    CapacityError,
    CheckpointError,
    ChunkStateError,
    ColossalError,
    ConfigError,
    DistributedError,
    InternalError,
    PolicyError,
    StateTransitionError,
)
from ._memory import (
    MemoryProbe,
    MemorySample,
    MemStatsSource,
    OrderStats,
    StepRecorder,
    TierName,
)
from ._placement import ChunkInfo, MemoryTier, PlacementPolicy
from ._sharding import ParamSharding, ShardAxis, sharding_axes
from ._state import LEGAL_TRANSITIONS, TensorState, check_transition

__version__ = "0.1.0"

__all__ = [
    "LEGAL_TRANSITIONS",
    "CapacityError",
    "CheckpointError",
    "ChunkInfo",
    "ChunkStateError",
    "ColossalError",
    "ConfigError",
    "DistributedError",
    "InternalError",
    "MemStatsSource",
    "MemoryProbe",
    "MemorySample",
    "MemoryTier",
    "OrderStats",
    "ParamSharding",
    "PlacementPolicy",
    "PolicyError",
    "ShardAxis",
    "StateTransitionError",
    "StepRecorder",
    "TensorState",
    "TierName",
    "check_transition",
    "sharding_axes",
]
