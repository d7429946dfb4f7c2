"""Gemini's chunk shards as per-parameter element runs, for the layout-independent checkpoint
of colossal-stack (``gemini_shards``, ``finish_gemini_load``).

A Gemini chunk's shard on this rank holds, for each parameter in it, a run of the parameter's
flat elements ``[lo, hi)`` (fp32 masters, and the Adam moments in the parallel chunks of the same
layout), exactly what ZeRO-1/2's flat buffers hold; a checkpoint writer places those runs in the
unsharded tensors, and a reader fills them in place and then calls ``finish_gemini_load``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from ._module import GeminiModule
from ._optimizer import GeminiOptimizer

__all__ = ["GeminiShard", "finish_gemini_load", "gemini_shards"]

_STATES = ("exp_avg", "exp_avg_sq")


@dataclass
class GeminiShard:
    """One parameter's elements in this rank's chunk shards.

    Attributes:
        name: the parameter's (canonical) name in the unsharded model.
        shape: the shape of the parameter as this rank's module holds it (its tp shard).
        flats: kind -> (1-D view of the elements held, first, end) in the shard's flat order.
        step: Adam's step count (None: never stepped).
        set_step: stores a loaded step count in the optimizer.
    """

    name: str
    shape: tuple[int, ...]
    flats: dict[str, tuple[torch.Tensor, int, int]]
    step: float | None
    set_step: Callable[[float], None]


def gemini_shards(model: GeminiModule, optimizer: GeminiOptimizer | None) -> Iterator[GeminiShard]:
    """What this rank's chunk shards hold of every parameter, chunk by chunk."""
    rt = model.runtime
    m = rt.manager
    for rec in m.groups.values():
        c = rec.param
        fp32 = rt.roles.fp32(c)
        with_states = optimizer is not None and not c.frozen  # frozen chunks: values only
        states = {k: rec.twin(k) for k in _STATES} if with_states else {}
        for name, rec in c.records.items():
            part = fp32.shard_view(name)
            if part is None:
                continue
            view, lo, hi = part
            flats = {"param": (view, lo, hi)}
            for kind, chunk in states.items():
                flats[kind] = (chunk.shard_part(name), lo, hi)  # same layout as fp32

            def set_step(v: float, name: str = name) -> None:
                if optimizer is not None:
                    optimizer.steps[name] = torch.tensor(v, dtype=torch.float32)

            step = None
            if optimizer is not None and name in optimizer.steps:
                step = float(optimizer.steps[name])
            yield GeminiShard(name, tuple(rec.shape), flats, step, set_step)


def finish_gemini_load(model: GeminiModule, optimizer: GeminiOptimizer | None) -> None:
    """After the masters and moments were filled in place: copy masters into the compute
    parameters (bf16/fp16), hand written chunks back to their tier, and drop gradients."""
    rt = model.runtime
    m = rt.manager
    for rec in m.groups.values():
        c = rec.param
        if rt.precision.master or c.frozen:  # frozen: a gathered copy is stale now
            rt.restore_params(c)
        with_states = optimizer is not None and not c.frozen
        states = [rec.twin(k) for k in _STATES] if with_states else []
        m.shard_io.written(dict.fromkeys([c, rt.roles.fp32(c), *states]))
    rt.clear_grads()
