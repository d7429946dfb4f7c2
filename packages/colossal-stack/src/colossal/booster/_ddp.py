"""Plain data parallelism: torch DDP across processes (gloo on CPU, NCCL on CUDA), or one process."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from colossal_contracts import ConfigError

from ..checkpoint._layout_legacy import DDP_META
from ..checkpoint._layout_load import load_layout
from ..checkpoint._whole import load_model_and_optimizer, save_model_and_optimizer
from ._device import move_model, resolve_device
from ._plugin import Plugin

__all__ = ["DDPPlugin"]


@dataclass
class DDPPlugin(Plugin):
    """Replicates the model on every rank and all-reduces gradients (a no-op in one process).

    Attributes:
        bucket_cap_mb: DDP gradient bucket size.
        find_unused_parameters: set when some parameters get no gradient in a step.
        save_frozen: write the values of frozen (``requires_grad=False``) parameters into
            checkpoints; ``colossal train`` clears it for LoRA runs, whose base is rebuilt
            from its source on resume and checked against its fingerprint.
        device: where the model trains ([Note: plugin device]); "auto": this rank's CUDA
            device, else the CPU. Resolved to a ``torch.device`` on construction.
    """

    bucket_cap_mb: int = 25
    find_unused_parameters: bool = False
    save_frozen: bool = True
    name: str = "ddp"
    device: torch.device = "auto"  # type: ignore[assignment]  # resolved in __post_init__

    def __post_init__(self) -> None:
        self.device = resolve_device(self.device)
        cap = self.bucket_cap_mb
        if not isinstance(cap, int | float) or isinstance(cap, bool) or not 0 < cap < 2**20:
            raise ConfigError(
                f"DDPPlugin(bucket_cap_mb) must be a positive number of MiB (default 25), got "
                f"{cap!r}"
            )

    @property
    def distributed(self) -> bool:
        return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1

    def configure(
        self, model: nn.Module, optimizer: torch.optim.Optimizer
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        move_model(model, self.device, optimizer)
        if not self.distributed:
            return model, optimizer
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        wrapped = DistributedDataParallel(
            model,
            device_ids=device_ids,
            bucket_cap_mb=self.bucket_cap_mb,
            find_unused_parameters=self.find_unused_parameters,
        )
        return wrapped, optimizer

    def backward(self, loss: torch.Tensor, optimizer: torch.optim.Optimizer) -> None:
        loss.backward()

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model.module if isinstance(model, DistributedDataParallel) else model

    def save_checkpoint(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, path: Path
    ) -> None:
        save_model_and_optimizer(
            path,
            self.unwrap(model),
            optimizer,
            {"plugin": self.name},
            frozen_values=self.save_frozen,
        )

    def load_checkpoint(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, path: Path
    ) -> None:
        if (Path(path) / DDP_META).is_file():  # its own format
            load_model_and_optimizer(path, self.unwrap(model), optimizer)
            return
        load_layout(self.unwrap(model), optimizer, None, Path(path))  # [Note: one reader]

    def choose_checkpoint_contents(self, *, export_full_model: bool, save_frozen: bool) -> None:
        """``save_frozen`` as given; the checkpoint is the full model already."""
        self.save_frozen = save_frozen
