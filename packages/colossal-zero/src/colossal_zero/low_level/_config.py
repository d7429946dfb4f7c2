"""The settings of ZeRO stages 1 and 2, in one frozen dataclass."""

from __future__ import annotations

from dataclasses import dataclass, field

from colossal_contracts import ConfigError

from ..optim._precision import Precision
from ..optim._scaler import LossScalerConfig

__all__ = ["ZERO_STAGES", "ZeroConfig"]

ZERO_STAGES = (1, 2)


@dataclass(frozen=True)
class ZeroConfig:
    """How ZeRO-1/2 shards a data-parallel model's training state.

    Attributes:
        stage: 1 (fp32 masters and Adam states sharded over data-parallel ranks) or 2 (gradients
            too, reduce-scattered into per-rank buckets while backward runs). Stage 3 is Gemini.
        precision: "fp32", "bf16" or "fp16" (low-precision params, fp32 masters; fp16 adds
            dynamic loss scaling), or "fp64" (parameters, gradients and Adam states in float64:
            [Note: fp64 precision]).
        offload_optimizer: keep the fp32 masters and Adam states in host memory and update them
            there with the hybrid Adam's CPU kernel.
        host_bytes: host memory the offloaded optimizer may use (None: what the OS reports
            available); too little is a ``CapacityError`` at construction.
        bucket_numel: elements per flat bucket (a parameter larger than it gets its own bucket).
        loss_scaler: dynamic loss scaling settings (fp16 only).
    """

    stage: int = 1
    precision: str = "fp32"
    offload_optimizer: bool = False
    host_bytes: int | None = None
    bucket_numel: int = 1 << 22
    loss_scaler: LossScalerConfig = field(default_factory=LossScalerConfig)

    def __post_init__(self) -> None:
        check_stage(self.stage)
        Precision.parse(self.precision)
        if self.bucket_numel < 1:
            raise ConfigError(f"bucket_numel must be positive, got {self.bucket_numel}")
        if self.host_bytes is not None and self.host_bytes < 0:
            raise ConfigError(f"host_bytes must be >= 0 or None, got {self.host_bytes}")

    @property
    def precision_spec(self) -> Precision:
        return Precision.parse(self.precision)


def check_stage(stage: object) -> None:
    """``ConfigError`` unless ``stage`` is 1 or 2; stage 3 points at Gemini."""
    if stage == 3:
        raise ConfigError(
            "ZeRO stage 3 (parameters sharded too) is Gemini here: use GeminiPlugin "
            "(colossal_zero.apply_gemini) instead of stage=3"
        )
    if isinstance(stage, bool) or stage not in ZERO_STAGES:
        raise ConfigError(f"unknown ZeRO stage {stage!r}; choose 1 or 2 (or GeminiPlugin for 3)")
