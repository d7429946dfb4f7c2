"""The LowLevelZero plugin: ZeRO stage 1 or 2 from colossal-zero (optimizer states, then
gradients, sharded over data-parallel ranks; parameters replicated)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from colossal_contracts import ConfigError, ParamSharding
from colossal_zero import (
    LazyInit,
    LowLevelZeroOptimizer,
    ZeroConfig,
    load_zero_sharded,
    save_zero_sharded,
)
from colossal_zero.checkpoint import INDEX_FILE

from .._capability import Combination, check_combination, table_precision
from .._sizes import parse_bytes
from ..checkpoint._layout_load import load_layout
from ._device import move_model, resolve_device
from ._full_model import write_full_model
from ._lazy_fill import fill_lazy
from ._plugin import Plugin

__all__ = ["LowLevelZeroPlugin"]


@dataclass
class LowLevelZeroPlugin(Plugin):
    """ZeRO-1/2 over all ranks (or ``group``): every rank keeps the model in compute precision.

    Attributes:
        stage: 1 (fp32 masters and Adam states sharded) or 2 (gradients too, reduce-scattered
            while backward runs). Stage 3 is ``GeminiPlugin``.
        precision: "fp32", "bf16" or "fp16" (fp32 masters; fp16 adds dynamic loss scaling), or
            "fp64" (float64 throughout).
        offload_optimizer: masters and Adam states in host memory, updated by the CPU kernel.
        host_budget: host bytes the offloaded optimizer may use ("8GiB"; None: what is free);
            an int of bytes after construction.
        max_grad_norm: clip the global gradient norm (0: no clipping).
        bucket_numel: elements per flat bucket (communication granularity).
        sharding: parameter name -> tensor-parallel layout (``colossal_models.sharding.describe_sharding``)
            so norms and overflow agree over the whole mesh; None: data parallelism only.
        group: the data-parallel process group (None: every rank).
        export_full_model: also write a consolidated fp32 ``model.safetensors`` per checkpoint.
        sharded_checkpoint: every rank writes its shard into the checkpoint directory.
        save_frozen: write the values of frozen (``requires_grad=False``) parameters into
            checkpoints; ``colossal train`` clears it for LoRA runs, whose base is rebuilt
            from its source on resume and checked against its fingerprint.
        device: where the model and its flat buffers live ([Note: plugin device]); "auto":
            this rank's CUDA device, else the CPU. Adam states follow it unless offloaded.
        lazy: the ``colossal.lazy_init()`` context the model was built in: each meta parameter
            is replayed alone onto ``device`` (bit-identical to eager; [Note: lazy fill]).
    """

    stage: int = 1
    precision: str = "fp32"
    offload_optimizer: bool = False
    host_budget: int | str | None = None
    max_grad_norm: float = 0.0
    bucket_numel: int = 1 << 22
    sharding: Mapping[str, ParamSharding] | None = field(default=None, repr=False)
    group: Any = field(default=None, repr=False)
    export_full_model: bool = True
    save_frozen: bool = True
    name: str = "zero"
    sharded_checkpoint: bool = True
    device: torch.device = "auto"  # type: ignore[assignment]  # resolved in __post_init__
    lazy: LazyInit | None = field(default=None, repr=False)
    _optimizer: LowLevelZeroOptimizer | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.host_budget = parse_bytes(self.host_budget, what="host_budget")  # parsed once
        self.zero_config()  # validates stage, precision, budget
        self.device = resolve_device(self.device)
        check_combination(self.combination(), what=f"LowLevelZeroPlugin(stage={self.stage})")

    def combination(self) -> Combination:
        """The kinds these settings compose ([Note: capability table])."""
        return Combination(
            sharding=f"zero{self.stage}",
            precision=table_precision(self.precision),  # fp64 composes as fp32
            lazy=self.lazy is not None,
        )

    def zero_config(self) -> ZeroConfig:
        """The ``ZeroConfig`` these settings stand for."""
        return ZeroConfig(
            stage=self.stage,
            precision=self.precision,
            offload_optimizer=self.offload_optimizer,
            host_bytes=parse_bytes(self.host_budget),  # an int already: __post_init__ parsed it
            bucket_numel=self.bucket_numel,
        )

    def configure(
        self, model: nn.Module, optimizer: torch.optim.Optimizer
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        """Turn ``optimizer`` (Adam/AdamW on ``model``'s fp32 parameters) into a
        ``LowLevelZeroOptimizer`` with the same groups; the model stays a plain module."""
        if self.lazy is not None:  # [Note: lazy fill]: one tensor at a time, onto the device
            fill_lazy(model, self.lazy, self.device)
        move_model(model, self.device, optimizer)  # before the flat buffers are built
        opt = LowLevelZeroOptimizer.from_torch(
            model,
            optimizer,
            config=self.zero_config(),
            group=self.group,
            max_grad_norm=self.max_grad_norm,
            sharding=self.sharding,
        )
        self._optimizer = opt
        return model, opt

    def backward(self, loss: torch.Tensor, optimizer: torch.optim.Optimizer) -> None:
        if isinstance(optimizer, LowLevelZeroOptimizer):
            optimizer.backward(loss)
        else:
            loss.backward()

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model

    def memory_stats(self) -> dict[str, Any]:
        """Model-state bytes by kind on this rank and collective bytes since construction."""
        if self._optimizer is None:
            return {}
        out: dict[str, Any] = {
            f"{k}_bytes": v for k, v in self._optimizer.model_state_bytes().items()
        }
        out.update({f"{k}_bytes_total": v for k, v in self._optimizer.comm_bytes.items()})
        return out

    def save_checkpoint(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, path: Path
    ) -> None:
        """Every rank writes its shard (colossal-zero's sharded layout, which Gemini reads too);
        rank 0 also the consolidated fp32 ``model.safetensors``. Collective."""
        opt = _zero_optimizer(optimizer)
        save_zero_sharded(opt, path, frozen_values=self.save_frozen)
        if self.export_full_model:
            write_full_model(opt.full_state_dict(), path)  # collective gather, rank 0 writes

    def load_checkpoint(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, path: Path
    ) -> None:
        if (Path(path) / INDEX_FILE).is_file():  # its own format (or mesh-less Gemini's)
            load_zero_sharded(_zero_optimizer(optimizer), path)
            return
        load_layout(model, _zero_optimizer(optimizer), None, Path(path))  # [Note: one reader]

    def choose_checkpoint_contents(self, *, export_full_model: bool, save_frozen: bool) -> None:
        self.export_full_model = export_full_model
        self.save_frozen = save_frozen

    def close(self, *, collective: bool = True) -> None:
        """ZeRO-1/2 waits for its collectives in the step and keeps no threads: nothing to join
        (its ``group``, when given, belongs to the caller)."""


def _zero_optimizer(optimizer: torch.optim.Optimizer) -> LowLevelZeroOptimizer:
    if not isinstance(optimizer, LowLevelZeroOptimizer):
        raise ConfigError(
            "LowLevelZeroPlugin checkpoints need the optimizer that Booster.boost returned"
        )
    return optimizer
