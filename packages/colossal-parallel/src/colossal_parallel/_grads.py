"""``all_reduce_grads``: sum or average the gradients of replicated parameters over a mesh axis.

Data-parallel replicas (``dp``) average; ranks that share a sequence (``sp``) each hold the
gradient of their own tokens' share of the loss, so they sum. The gradients travel as one
flattened buffer per dtype (one counted all-reduce each), and are written back in place.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from ._comm import CountedComm

__all__ = ["all_reduce_grads"]


def all_reduce_grads(
    parameters: Iterable[nn.Parameter], comm: CountedComm, axis: str, *, average: bool
) -> None:
    """All-reduce the ``.grad`` of every parameter over ``axis``; divide by its size if
    ``average``. Parameters without a gradient count as zeros (every rank must list the same
    parameters in the same order)."""
    params = [q for q in parameters if q.requires_grad]
    if comm.size(axis) == 1 or not params:
        return
    by_dtype: dict[torch.dtype, list[nn.Parameter]] = {}
    for q in params:
        by_dtype.setdefault(q.dtype, []).append(q)
    for group in by_dtype.values():
        flat = torch.cat(
            [(q.grad if q.grad is not None else torch.zeros_like(q)).reshape(-1) for q in group]
        )
        flat = comm.all_reduce(flat, axis)
        if average:
            flat /= comm.size(axis)
        offset = 0
        for q in group:
            n = q.numel()
            q.grad = flat[offset : offset + n].view_as(q).clone()
            offset += n
