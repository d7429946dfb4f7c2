"""The settings of Gemini, in one frozen dataclass."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from colossal_contracts import ConfigError

from ..optim._precision import Precision
from ..optim._scaler import LossScalerConfig

__all__ = ["PLACEMENTS", "STATE_PLACEMENTS", "GeminiConfig"]

PLACEMENTS = ("auto", "static")
STATE_PLACEMENTS = ("free", "demand", "host")


@dataclass(frozen=True)
class GeminiConfig:
    """How Gemini places, shards and computes a model.

    Attributes:
        precision: "fp32" (exact), "bf16" or "fp16" (low-precision params, fp32 masters), or
            "fp64" (chunks, their reductions and Adam states in float64: [Note: fp64 precision]).
        placement: "auto" (trace the first step, then Belady eviction and prefetch) or "static"
            (a fixed share of parameter chunks lives on the accelerator, the rest streams in).
        accelerator_bytes: byte budget of chunk payloads on the compute tier (None: the whole
            device; no limit on an emulated accelerator). It must hold the largest chunk.
        host_bytes: byte budget of chunk payloads in host memory (None: no limit).
        disk_bytes: byte budget on disk (0: no disk tier; None: no limit). Chunks spill there
            when the host budget is full: fp32 masters and Adam states first (they are added
            last), then cold parameter chunks evicted from the accelerator.
        disk_dir: directory of the disk tier's files (None: a temporary one, removed on close).
        read_ahead_bytes: bytes of ``host_bytes`` kept for disk pages read ahead of their use
            (colossal-chunk's [Note: read-ahead window]; 0: no read-ahead, None: the default,
            up to four fp32 chunks and at most a quarter of ``host_bytes``).
        chunk_numel: elements per chunk; None searches for the size with least padding.
        frozen_chunk_numel: elements per frozen chunk (the ``requires_grad=False`` parameters',
            packed apart: colossal-chunk's [Note: chunk size per kind]); None: searched for the
            frozen tensors alone when ``chunk_numel`` is None too, else ``chunk_numel``.
        device: "auto", "cuda" or "cpu" (an emulated accelerator), as ``ChunkConfig.device``.
        non_model_bytes: bytes of the compute tier kept free for activations while nothing is
            measured: in the warmup step, and at every moment when no ``StepRecorder`` is given
            to ``apply_gemini`` (then one constant reserve); 0 when unknown.
        non_model_margin: safety margin on the per-moment non-model peaks the warmup measured
            (0.1: the room for chunks at a moment is the budget minus 110% of its peak).
        prefetch: moments ahead whose chunks are copied early once the compute order is known,
            where the plan shows room (0: off).
        overlap_comm: on more than one rank, start the next moment's all-gathers and every
            full gradient chunk's reduce-scatter without waiting, so they run while operators
            compute ([Note: overlap]); False waits for each collective (the same values).
        gather_ahead: with ``overlap_comm``, how many parameter chunks of the coming moments
            are all-gathered as a moment begins, as one collective where room allows ([Note:
            gathers several ahead]); 1: the next moment's chunks only.
        states_placement: where Adam states and fp32 masters live, chunk by chunk, once the
            plan is known (placement "auto" only; see [Note: state placement]): "free" moves
            them to the accelerator into room no chunk used at any moment of a measured step (no
            extra moves), "demand" also into room that cached parameter chunks filled but no
            moment needed (fewer host bytes, more moves), "host" keeps them on the host.
        loss_scaler: dynamic loss scaling settings (used with fp16 only).
        update_in_backward: run each chunk's Adam update in backward as soon as its gradients
            are reduced, so gradients on a disk tier are neither written nor read back
            ([Note: update in backward]); None: on when there is a disk tier and it can run
            (no clipping, no fp16 loss scaler, and a step without undeclared accumulation);
            True: also without a disk tier, a ``ConfigError`` where it cannot run; False: off.
    """

    precision: str = "fp32"
    placement: str = "auto"
    accelerator_bytes: int | None = None
    host_bytes: int | None = None
    disk_bytes: int | None = 0
    disk_dir: str | os.PathLike[str] | None = None
    read_ahead_bytes: int | None = None
    chunk_numel: int | None = None
    frozen_chunk_numel: int | None = None
    device: str = "auto"
    non_model_bytes: int = 0
    non_model_margin: float = 0.1
    prefetch: int = 1
    overlap_comm: bool = True
    gather_ahead: int = 3
    states_placement: str = "free"
    loss_scaler: LossScalerConfig = field(default_factory=LossScalerConfig)
    update_in_backward: bool | None = None

    def __post_init__(self) -> None:
        Precision.parse(self.precision)
        if self.placement not in PLACEMENTS:
            raise ConfigError(
                f"unknown placement {self.placement!r}; choose one of: {', '.join(PLACEMENTS)}"
            )
        for name in (
            "accelerator_bytes",
            "host_bytes",
            "disk_bytes",
            "chunk_numel",
            "frozen_chunk_numel",
            "read_ahead_bytes",
        ):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                raise ConfigError(
                    f"{name} must be an int (bytes or elements) or None, got "
                    f"{type(value).__name__} {value!r}"
                )
            if value is not None and value < 0:
                raise ConfigError(f"{name} must be >= 0 or None, got {value}")
        if self.chunk_numel == 0 or self.frozen_chunk_numel == 0:
            raise ConfigError(
                "chunk_numel and frozen_chunk_numel must be positive (or None to search for one)"
            )
        if self.non_model_bytes < 0 or self.prefetch < 0 or self.non_model_margin < 0:
            raise ConfigError("non_model_bytes, non_model_margin and prefetch must be >= 0")
        if (
            isinstance(self.gather_ahead, bool)
            or not isinstance(self.gather_ahead, int)
            or (self.gather_ahead < 1)
        ):
            raise ConfigError(
                f"gather_ahead must be an int >= 1 (chunks gathered ahead; 1: the next "
                f"moment's only), got {self.gather_ahead!r}"
            )
        if self.update_in_backward not in (None, True, False):
            raise ConfigError(
                f"update_in_backward must be True, False or None (auto), got "
                f"{self.update_in_backward!r}"
            )
        if self.states_placement not in STATE_PLACEMENTS:
            raise ConfigError(
                f"unknown states_placement {self.states_placement!r}; choose one of: "
                f"{', '.join(STATE_PLACEMENTS)}"
            )

    @property
    def precision_spec(self) -> Precision:
        return Precision.parse(self.precision)
