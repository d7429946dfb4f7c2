"""Running a plugin's placement logic on torch's ``meta`` device, in one process.

[Note: meta placement] A rank of any world runs alone: torch.distributed's fake backend
(``cpu:fake,meta:fake``, from torch's testing package) answers every collective at once without
a peer, so rank ``r`` of an 8-rank mesh builds its groups, stages and shards as it would in the
real world. With the plugin's ``device="meta"``, any computation that mixes a tensor left on
the CPU with the model's tensors raises (torch's meta kernels check devices; only 0-dim CPU
scalars mix, as on CUDA), and afterwards ``misplaced`` walks the model, optimizer and plugin for
tensors left behind. Meta tensors have no values: ``MetaHostReads`` answers the few host reads a
step makes (``.item()``, ``.cpu()`` of a norm) with ones (False for flags), so norms are finite
and nothing overflows. ``HostCollectives`` records collectives given CPU tensors, which NCCL
would refuse.
"""

from __future__ import annotations

import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

_aten = torch.ops.aten


class MetaHostReads(TorchDispatchMode):
    """Host reads of meta tensors return ones (False for bool): see [Note: meta placement]."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        src = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if src is not None and src.device.type == "meta":
            if func is _aten._local_scalar_dense.default:
                return False if src.dtype == torch.bool else 1
            dev = kwargs.get("device")
            if (
                func is _aten._to_copy.default
                and dev is not None
                and torch.device(dev).type == "cpu"
            ):
                dtype = kwargs.get("dtype") or src.dtype
                return (torch.zeros if dtype == torch.bool else torch.ones)(src.shape, dtype=dtype)
        return func(*args, **kwargs)


class HostCollectives(TorchDispatchMode):
    """Records each collective that is given a CPU tensor (``(op, shapes, caller)``)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, list[tuple[int, ...]], str]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if func.namespace == "c10d":
            ts = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
            if any(t.device.type == "cpu" for t in ts):
                caller = _caller()
                self.seen.append((str(func), [tuple(t.shape) for t in ts], caller))
        return func(*args, **kwargs)


def _caller() -> str:
    for frame in reversed(traceback.extract_stack()):
        if "colossal" in frame.filename and "/tests/" not in frame.filename:
            return f"{frame.filename.rsplit('/src/', 1)[-1]}:{frame.lineno}"
    return "?"


@contextmanager
def fake_world(world: int, rank: int) -> Iterator[None]:
    """This process as rank ``rank`` of a ``world``-rank fake group (none for ``world`` 1)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if world > 1:
        dist.init_process_group(
            "cpu:fake,meta:fake", store=FakeStore(), rank=rank, world_size=world
        )
    try:
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def misplaced(device: torch.device, *roots: Any) -> list[str]:
    """Paths (from ``roots``' attributes) of every tensor not on ``device``, except 0-dim CPU
    scalars (which torch mixes with any device: Adam's step counts)."""
    out: list[str] = []
    seen: set[int] = set()
    stack: list[tuple[str, Any]] = [(f"root{i}", r) for i, r in enumerate(roots)]
    while stack:
        path, obj = stack.pop()
        if id(obj) in seen or obj is None or isinstance(obj, str | int | float | bool):
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            ok = obj.device == device or (obj.device.type == "cpu" and obj.dim() == 0)
            if not ok:
                out.append(f"{path}: {tuple(obj.shape)} on {obj.device}")
            grad = obj.grad if obj.is_leaf and obj.requires_grad else None
            if grad is not None:
                stack.append((f"{path}.grad", grad))
            continue
        if isinstance(obj, dist.ProcessGroup | torch.device | torch.dtype | type):
            continue
        if isinstance(obj, dict):
            for k, v in obj.items():
                stack.append((f"{path}[{k!r}]" if isinstance(k, str) else f"{path}[key]", v))
                if isinstance(k, torch.Tensor):
                    stack.append((f"{path}[key]", k))
        elif isinstance(obj, list | tuple | set | frozenset):
            stack.extend((f"{path}[{i}]", v) for i, v in enumerate(obj))
        elif _walkable(obj):
            attrs = dict(vars(obj)) if hasattr(obj, "__dict__") else {}
            for cls in type(obj).__mro__:
                for slot in getattr(cls, "__slots__", ()):
                    if hasattr(obj, slot):
                        attrs[slot] = getattr(obj, slot)
            stack.extend((f"{path}.{k}", v) for k, v in attrs.items())
    return sorted(out)


def _walkable(obj: Any) -> bool:
    mod = type(obj).__module__ or ""
    return mod.startswith(("colossal", "torch.nn", "torch.optim")) or mod == "builtins"
