"""Protocols for measuring memory and for the statistics planners consume.

memtrace implements them; chunk consumes them. Neither imports the other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Protocol, runtime_checkable

__all__ = ["MemStatsSource", "MemoryProbe", "MemorySample", "TierName"]


class TierName(str, Enum):
    """The memory tiers a chunk can live in, fastest first."""

    ACCELERATOR = "accelerator"
    HOST = "host"
    DISK = "disk"


@dataclass(frozen=True)
class MemorySample:
    """One reading of a probe.

    Attributes:
        used_bytes: bytes in use now.
        peak_bytes: highest ``used_bytes`` since the last ``reset_peak``.
        emulated: True when the figure comes from an emulated tier (CPU standing in for a GPU).
    """

    used_bytes: int
    peak_bytes: int
    emulated: bool = False


@runtime_checkable
class MemoryProbe(Protocol):
    """Reads the memory of one tier. Must never raise because a device or library is missing."""

    name: str
    tier: TierName

    def sample(self) -> MemorySample:
        """Current and peak usage."""
        ...

    def reset_peak(self) -> None:
        """Start a new peak window."""
        ...


@runtime_checkable
class MemStatsSource(Protocol):
    """What a warmup iteration learned, for planners of later iterations.

    A training step is cut into moments (one per module forward/backward boundary). Moment ``i``
    used the parameters ``compute_order()[i]`` (names as in ``model.named_parameters()``), and
    non-model data (activations, temporaries) peaked at ``non_model_peak(i, tier)`` bytes in it.
    """

    def num_moments(self) -> int:
        """Number of moments in one step."""
        ...

    def non_model_peak(self, moment: int, tier: TierName | str) -> int:
        """Peak non-model bytes on ``tier`` during ``moment`` (0 <= moment < num_moments)."""
        ...

    def compute_order(self) -> Sequence[tuple[str, ...]]:
        """For each moment, the names of the parameters it used, in order of use."""
        ...
