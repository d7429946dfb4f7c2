"""Where a plugin computes: resolving its ``device`` setting and moving a model, its optimizer
state and batches there.

[Note: plugin device] Every plugin has a ``device`` setting: "auto" (the default) is this
process's CUDA device when CUDA exists (``cuda:LOCAL_RANK`` modulo the device count, the one
``launch_from_torch`` selects), else the CPU; any other value names a torch device ("cpu",
"cuda:1", "meta" in the placement tests). ``configure`` moves the model there before it builds
anything from its parameters (DDP's buckets, ZeRO's flat buffers and Adam states, the pipeline's
chunks), and the Booster moves each batch there (``Booster.to_device``). Parameters keep their
identity when moved (``Module.to`` replaces ``.data``), so an optimizer built on them before
``boost`` still holds them; its state tensors, if any, are moved with them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from colossal_contracts import ConfigError

__all__ = ["move_model", "move_optimizer_state", "resolve_device", "to_device"]


def resolve_device(device: str | torch.device) -> torch.device:
    """The torch device ``device`` stands for (see [Note: plugin device]); a one-line
    ``ConfigError`` for a name torch does not know or CUDA asked for where there is none."""
    if isinstance(device, torch.device):
        dev = device
    elif device == "auto":
        if not torch.cuda.is_available():
            return torch.device("cpu")
        local = int(os.environ.get("LOCAL_RANK", torch.cuda.current_device()))
        return torch.device("cuda", local % torch.cuda.device_count())
    else:
        try:
            dev = torch.device(device)
        except (RuntimeError, TypeError) as err:
            raise ConfigError(
                f"device must be 'auto' or a torch device such as 'cpu' or 'cuda:0', got {device!r}"
            ) from err
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            f"device {device!r} needs CUDA, and torch sees no CUDA device here; use device='auto' "
            "or 'cpu'"
        )
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def move_model(
    model: nn.Module, device: torch.device, optimizer: torch.optim.Optimizer | None = None
) -> dict[int, nn.Parameter]:
    """Move ``model``'s parameters, buffers and ``optimizer``'s state to ``device`` in place.
    Where torch replaces a parameter instead of its ``.data`` (moving to the meta device, or
    under ``torch.__future__.set_overwrite_module_params_on_conversion``), the optimizer's groups
    and state are pointed at the new parameters; returns those replacements (``id`` of the old
    parameter -> the new one) for other holders of parameters to follow."""
    before = [(n, p) for n, p in model.named_parameters(remove_duplicate=False)]
    if any(t.device != device for t in _tensors(model)):
        model.to(device)
    after = dict(model.named_parameters(remove_duplicate=False))
    swap = {id(p): after[n] for n, p in before if after[n] is not p}
    if optimizer is None:
        return swap
    if swap:
        for group in optimizer.param_groups:
            group["params"] = [swap.get(id(p), p) for p in group["params"]]
        state = optimizer.state
        for old in [p for p in state if id(p) in swap]:
            state[swap[id(old)]] = state.pop(old)
    move_optimizer_state(optimizer, device)
    return swap


def move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """Move every tensor of ``optimizer.state`` to ``device``, except a 0-dim CPU ``step`` (torch's
    Adam keeps its step count on the host unless ``capturable`` or ``fused``)."""
    for state in optimizer.state.values():
        for k, v in state.items():
            if isinstance(v, torch.Tensor) and v.device != device and not _cpu_step(k, v):
                state[k] = v.to(device)


def to_device(obj: Any, device: torch.device) -> Any:
    """``obj`` with every tensor in it (a tensor, or a tuple/list/dict of them) on ``device``;
    copies from pinned host memory are asynchronous."""
    if isinstance(obj, torch.Tensor):
        if obj.device == device:
            return obj
        return obj.to(device, non_blocking=obj.device.type == "cpu" and obj.is_pinned())
    if isinstance(obj, tuple | list):
        return type(obj)(to_device(v, device) for v in obj)
    if isinstance(obj, dict):
        return {k: to_device(v, device) for k, v in obj.items()}
    return obj


def _tensors(model: nn.Module) -> Iterator[torch.Tensor]:
    yield from model.parameters()
    yield from model.buffers()


def _cpu_step(key: str, value: torch.Tensor) -> bool:
    return key == "step" and value.dim() == 0 and value.device.type == "cpu"
