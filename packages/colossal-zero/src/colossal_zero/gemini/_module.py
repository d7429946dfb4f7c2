"""``apply_gemini``: the one verb that puts a module's parameters into Gemini chunks."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils._pytree import tree_map

from colossal_chunk import ManagerStats, map_large_host_blocks, trim_host_heap
from colossal_contracts import ConfigError, StepRecorder, TierName

from .._lazy import LazyInit
from ._config import GeminiConfig
from ._runtime import GeminiRuntime

__all__ = ["GeminiModule", "apply_gemini", "default_group"]


def default_group() -> dist.ProcessGroup | None:
    """The world group when torch.distributed is initialised with more than one rank, else None."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return dist.group.WORLD
    return None


class GeminiModule(nn.Module):
    """A module whose parameters live in Gemini chunks; call it like the module it wraps.

    ``module`` is the user's module (its parameters' ``.data`` are views into chunks: see
    [Note: parameter views] in colossal-chunk). Use ``full_state_dict`` for real values.
    """

    def __init__(self, module: nn.Module, runtime: GeminiRuntime):
        super().__init__()
        self.module = module
        self.runtime = runtime

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        dev = self.compute_device
        if dev.type != "cpu":
            args, kwargs = tree_map(lambda t: _to(t, dev), (args, kwargs))
        self.runtime.begin_forward()
        try:
            if self.runtime.keeping:  # [Note: kept gradients]: no operator needs a hook
                return self.module(*args, **kwargs)
            with self.runtime.mode:
                return self.module(*args, **kwargs)
        finally:
            self.runtime.end_forward()

    def memory_stats(self) -> ManagerStats:
        """Per-tier bytes and bytes moved by the chunk manager."""
        return self.runtime.manager.books.stats()

    @property
    def compute_device(self) -> torch.device:
        """Where chunks compute: the accelerator tier's device (CUDA, or the CPU emulating it)."""
        return self.runtime.manager.books.tiers[TierName.ACCELERATOR].device

    def reset_peaks(self) -> None:
        """Start every tier's peak bytes over: the next ``memory_stats`` reports the peaks since."""
        self.runtime.manager.books.reset_peaks()

    def close(self, *, settle: bool = True) -> None:
        """Join the chunk manager's background work (prefetch copies, disk readers and writer)
        and remove its disk files; with ``settle``, first finish the chunk collectives and
        copies in flight (every rank of the group calls it then). No training after it."""
        self.runtime.close_recorders()
        manager = self.runtime.manager
        if settle:
            manager.settle()
        manager.close()

    @torch.no_grad()
    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Every parameter (fp32, float64 under fp64: the masters when they exist) and buffer of
        the module, full and on the CPU, under the module's own names (tied names included).
        Collective."""
        rt = self.runtime
        values: dict[str, torch.Tensor] = {}
        for c in (g.param for g in rt.manager.groups.values()):
            src = rt.roles.fp32(c)
            full = gather_shard(src.payload, rt.group)
            for name, rec in c.records.items():
                value = full[rec.offset : rec.end].view(rec.shape)
                values[name] = value.to(torch.promote_types(value.dtype, torch.float32)).clone()
        out = {n: values[canon] for n, canon in rt.aliases.items()}
        for n, b in self.module.named_buffers():
            out[n] = b.detach().cpu().clone()
        return out


def gather_shard(shard: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """The full 1-D chunk from every rank's shard (a CPU copy)."""
    world = dist.get_world_size(group) if group is not None else 1
    if world == 1:
        return shard.detach().cpu()
    dev = _comm_device(group)
    local = shard.detach().to(dev).contiguous()
    full = torch.empty(local.numel() * world, dtype=local.dtype, device=dev)
    dist.all_gather_into_tensor(full, local, group=group)
    return full.cpu()


def _comm_device(group: dist.ProcessGroup | None) -> torch.device:
    """Where tensors must be for collectives on ``group``: the current CUDA device under NCCL."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _to(t: Any, dev: torch.device) -> Any:
    return t.to(dev, non_blocking=True) if isinstance(t, torch.Tensor) else t


def apply_gemini(
    module: nn.Module,
    config: GeminiConfig | None = None,
    *,
    group: dist.ProcessGroup | str | None = "default",
    recorder: StepRecorder | None = None,
    lazy: LazyInit | None = None,
) -> GeminiModule:
    """Put ``module``'s parameters into Gemini chunks and return it wrapped.

    ``group`` is the data-parallel group chunks are sharded across ("default": the world when
    more than one rank is running; None: no sharding). ``recorder`` measures the warmup step's
    non-model bytes moment by moment (colossal-memtrace's ``MomentRecorder``; see [Note: warmup]);
    without one, every moment reserves ``config.non_model_bytes``. A model built inside ``lazy``
    (a ``LazyInit``) is materialized chunk by chunk straight into its tier ([Note: lazy init]).
    Parameters are cast to the precision's
    dtype (fp32 masters keep their original values). Raises ``ConfigError`` before any training
    when the budget cannot hold one chunk in use, or the placement or precision is unknown.
    """
    config = config or GeminiConfig()
    if isinstance(group, str) and group != "default":
        raise ConfigError(f'group must be a ProcessGroup, None or "default", got {group!r}')
    pg = default_group() if isinstance(group, str) else group
    runtime = GeminiRuntime(module, config, pg, recorder, lazy)
    # the module's own parameter storages, freed as their values moved into chunks, leave the C
    # heap (glibc keeps freed blocks: an eager model's size in RSS for the whole run)
    trim_host_heap()
    if config.host_bytes is not None:  # [Note: bounded host heap] in colossal-chunk
        map_large_host_blocks()
    return GeminiModule(module, runtime)
