"""Materializing a lazily built model where its tensors live whole: ZeRO-1/2, the hybrid plugin.

[Note: lazy fill] A model built inside ``colossal.lazy_init()`` has meta parameters whose values
colossal-zero's ``LazyInit`` replays one storage at a time ([Note: lazy init]: bit for bit what
eager construction gives under the same seed). Gemini replays them chunk by chunk into its tiers;
the plugins that keep each tensor whole replay each of this rank's parameters alone, move it to
the plugin's device and swap it into the same ``nn.Parameter`` object
(``torch.utils.swap_tensors``), so an optimizer built on the meta model keeps holding it and tied
parameters stay one. Only what this rank keeps is replayed: the hybrid plugin shards its model
through the plan and cuts its pipeline stages on the meta device first (``sharding_lazily``), so
another stage's layers and another tp rank's slices are never built. The host holds one tensor
(and what its record reads: a tp slice's whole tensor) beyond what the rank keeps.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from colossal_zero import LazyInit

__all__ = ["fill_lazy", "sharding_lazily"]


@torch.no_grad()
def fill_lazy(module: nn.Module, lazy: LazyInit, device: torch.device) -> None:
    """Give ``module``'s meta parameters and buffers their values on ``device`` (see
    [Note: lazy fill]); parameters keep their identity. A no-op without meta tensors."""
    replayed: list[torch.Tensor] = []
    for p in module.parameters():  # each shared parameter once
        if not p.is_meta:
            continue
        meta = p.detach()  # the recorded storage, kept to forget its record
        real = lazy.materialize(meta).to(device)
        torch.utils.swap_tensors(p, nn.Parameter(real, requires_grad=p.requires_grad))
        replayed.append(meta)
    for sub in module.modules():
        for name, b in list(sub._buffers.items()):
            if b is not None and b.is_meta:
                sub._buffers[name] = lazy.materialize(b).to(device)
                replayed.append(b)
    for t in replayed:  # after all: views of one storage share its record
        lazy.forget(t)


@contextmanager
def sharding_lazily(lazy: LazyInit | None) -> Iterator[None]:
    """Inside: what slices or rebuilds a meta model (a tensor-parallel plan) is recorded by
    ``lazy`` too, so each slice replays from its whole tensor when filled. Without ``lazy``:
    nothing."""
    if lazy is None:
        yield
        return
    with lazy:
        yield
