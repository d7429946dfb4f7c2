"""Protocols for measuring memory and for the statistics planners consume.

memtrace implements them; chunk consumes them. Neither imports the other.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Protocol, runtime_checkable

from ._errors import ConfigError

__all__ = [
    "MemStatsSource",
    "MemoryProbe",
    "MemorySample",
    "OrderStats",
    "StepRecorder",
    "TierName",
]


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

    [Note: moments] A training step is cut into moments; a moment begins where a planner may move
    chunks, i.e. right before parameters are used. Gemini cuts one moment per operator that reads
    parameters in forward and one per backward access of them (the granularity its runtime
    plans at, recorded through a ``StepRecorder``); memtrace's hook tracer cuts at module
    boundaries and at reads of parameters outside their module. Moment ``i`` used the parameters
    ``compute_order()[i]`` (names as in ``model.named_parameters()``), and non-model data
    (activations, temporaries) peaked at ``non_model_peak(i, tier)`` bytes in it.
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


class OrderStats:
    """The plain ``MemStatsSource``: a compute order with given (default zero) non-model peaks on
    the accelerator, for planners used without a memory tracer.

    Attributes:
        order: per moment, the parameter names it uses.
        non_model: per moment, the non-model peak on the accelerator in bytes.
    """

    def __init__(self, order: Sequence[Sequence[str]], non_model: Sequence[int] | None = None):
        self.order = [tuple(m) for m in order]
        self.non_model = list(non_model) if non_model is not None else [0] * len(self.order)
        if len(self.non_model) != len(self.order):
            raise ConfigError(
                f"non_model has {len(self.non_model)} entries but the order has "
                f"{len(self.order)} moments; give one peak per moment"
            )

    def num_moments(self) -> int:
        return len(self.order)

    def non_model_peak(self, moment: int, tier: TierName | str) -> int:
        return self.non_model[moment] if TierName(tier) is TierName.ACCELERATOR else 0

    def compute_order(self) -> Sequence[tuple[str, ...]]:
        return self.order


@runtime_checkable
class StepRecorder(Protocol):
    """Measures one step moment by moment for a runtime that cuts its own moments (Gemini, see
    [Note: moments]); memtrace implements it, the runtime calls it, neither imports the other.

    The runtime calls ``start`` before the step, ``cut(params)`` as each moment begins (``params``:
    the names it uses), ``finish`` after the last one, and ``close`` at a point outside backward
    (a dispatch mode popped inside an autograd callback is pushed back when backward returns).
    """

    def start(
        self, model_bytes: Callable[[TierName], int], model_tensors: Iterable[object]
    ) -> None:
        """Begin a step. ``model_bytes(tier)`` is the model data held on ``tier`` now (a cheap
        counter read); ``model_tensors`` are the tensors holding it (counted as live from now)."""
        ...

    def cut(self, params: tuple[str, ...]) -> None:
        """Close the open moment and open one that uses ``params``."""
        ...

    def finish(self) -> MemStatsSource:
        """Close the last moment and stop measuring; the step's per-moment figures."""
        ...

    def close(self) -> None:
        """Remove whatever measuring installed (after ``finish``, or to drop an unfinished step)."""
        ...
