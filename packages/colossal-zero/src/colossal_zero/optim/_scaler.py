"""Dynamic loss scaling for fp16: scale the loss up, skip steps whose gradients overflow.

[Note: loss scaling] The loss is multiplied by ``scale`` before backward so small fp16 gradients
do not flush to zero. Before the update the optimizer checks the global gradient norm (summed
over every shard on every rank, so all ranks agree): if it is inf or nan the step is skipped and
the scale is multiplied by ``backoff_factor``; after ``growth_interval`` clean steps in a row it is
multiplied by ``growth_factor``. The scale never goes below ``min_scale``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from colossal_contracts import ConfigError

__all__ = ["DynamicLossScaler", "LossScalerConfig"]


@dataclass(frozen=True)
class LossScalerConfig:
    """Settings of ``DynamicLossScaler``.

    Attributes:
        init_scale: first scale (a power of two keeps scaling exact).
        growth_factor: multiplier after ``growth_interval`` clean steps (> 1).
        backoff_factor: multiplier after an overflow (in (0, 1)).
        growth_interval: clean steps in a row before growing.
        min_scale: the scale never drops below it.
    """

    init_scale: float = 2.0**16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 1000
    min_scale: float = 1.0

    def __post_init__(self) -> None:
        if not self.init_scale > 0 or not self.min_scale > 0:
            raise ConfigError("init_scale and min_scale must be positive")
        if not self.growth_factor > 1:
            raise ConfigError(f"growth_factor must be > 1, got {self.growth_factor}")
        if not 0 < self.backoff_factor < 1:
            raise ConfigError(f"backoff_factor must be in (0, 1), got {self.backoff_factor}")
        if self.growth_interval < 1:
            raise ConfigError(f"growth_interval must be >= 1, got {self.growth_interval}")


class DynamicLossScaler:
    """See [Note: loss scaling]. ``update(overflow)`` after each step decides the next scale."""

    scale: float
    num_skipped: int  # steps skipped because of overflow, in total

    def __init__(self, config: LossScalerConfig | None = None):
        self.config = config or LossScalerConfig()
        self.scale = self.config.init_scale
        self.num_skipped = 0
        self._clean = 0

    def update(self, overflow: bool) -> None:
        """Back off after an overflow; grow after ``growth_interval`` clean steps."""
        c = self.config
        if overflow:
            self.scale = max(c.min_scale, self.scale * c.backoff_factor)
            self.num_skipped += 1
            self._clean = 0
            return
        self._clean += 1
        if self._clean >= c.growth_interval:
            self.scale *= c.growth_factor
            self._clean = 0

    def state_dict(self) -> dict[str, Any]:
        return {"scale": self.scale, "num_skipped": self.num_skipped, "clean": self._clean}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scale = float(state["scale"])
        self.num_skipped = int(state["num_skipped"])
        self._clean = int(state["clean"])
