"""The error hierarchy every Colossal package raises from.

Messages say what was wrong and how to fix it. Catch ``ColossalError`` to catch them all.
"""

from __future__ import annotations

__all__ = [
    "CapacityError",
    "CheckpointError",
    "ChunkStateError",
    "ColossalError",
    "ConfigError",
    "DistributedError",
    "InternalError",
    "PolicyError",
    "StateTransitionError",
]


class ColossalError(Exception):
    """Base of every error Colossal raises on purpose."""


class ConfigError(ColossalError, ValueError):
    """A setting or an argument is invalid (unknown preset, bad mesh shape, non-positive count)."""


class CapacityError(ColossalError, MemoryError):
    """A memory tier cannot hold what is asked of it (working set larger than the budget)."""


class StateTransitionError(ColossalError, RuntimeError):
    """A tensor was asked to move between two states the transition table does not allow."""


class CheckpointError(ColossalError, RuntimeError):
    """A checkpoint is missing, corrupt, or does not match the model it is loaded into."""


class DistributedError(ColossalError, RuntimeError):
    """The process group or launch environment is missing or inconsistent."""


class ChunkStateError(ColossalError, RuntimeError):
    """A chunk was asked for what its state does not allow (read while not gathered, moved with
    a collective in flight, gathered twice, used before it has a shard)."""


class PolicyError(ColossalError, RuntimeError):
    """A placement policy broke its contract (returned a chunk id it was not offered)."""


class InternalError(ColossalError, RuntimeError):
    """An invariant of Colossal itself broke (accounting went negative): a bug to report, not a
    mistake in the caller's input."""
