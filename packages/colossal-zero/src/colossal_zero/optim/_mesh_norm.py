"""One gradient norm and one overflow flag for the whole mesh (see [Note: mesh-wide norms] in
colossal-contracts), shared by Gemini's optimizer and ZeRO-1/2.

Each rank passes the gradient pieces it owns: its data-parallel shard of each parameter, and the
``ParamSharding`` of that parameter (None: an ordinary parameter, replicated over nothing but
data parallelism). Squares are summed in float64 over the pieces this rank counts; the non-finite
flag over every piece (a replica that overflowed counts even when its norm does not). The pair is
all-reduced over the data-parallel group, then over each named axis in name order, so every rank
of the mesh ends with the same two numbers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist

from colossal_contracts import ParamSharding, ShardAxis, sharding_axes

from ._clip import clip_coef

__all__ = ["GradNorm", "mesh_grad_norm", "piece_squares", "reduce_squares"]


@dataclass(frozen=True)
class GradNorm:
    """The global 2-norm of the gradients and whether any rank saw inf/nan.

    Attributes:
        norm: the 2-norm over every element of the unsharded model once (inf/nan on overflow).
        overflow: True when any gradient element on any rank of the mesh is inf or nan.
    """

    norm: float
    overflow: bool

    def clip_coef(self, max_grad_norm: float) -> float:
        """What the gradients are multiplied by to clip them to ``max_grad_norm`` (1.0: not
        clipped); Gemini's and ZeRO's arithmetic (``_clip.clip_coef``)."""
        return clip_coef(max_grad_norm, self.norm)


def mesh_grad_norm(
    parts: Iterable[tuple[torch.Tensor, ParamSharding | None]],
    *,
    group: dist.ProcessGroup | None = None,
    shardings: Mapping[str, ParamSharding] | None = None,
) -> GradNorm:
    """The norm of ``parts`` over ``group`` (data parallel; None: this process) and the mesh axes
    that ``shardings`` name. Collective over all of them: every rank must call it with the same
    ``shardings`` keys, even one that owns no piece."""
    return reduce_squares(piece_squares(parts), group=group, shardings=shardings)


def piece_squares(
    parts: Iterable[tuple[torch.Tensor, ParamSharding | None]],
) -> list[tuple[float, bool]]:
    """Per piece, in order: its squared 2-norm (float64, accumulated in at least fp32) and whether
    this rank counts it. One ``_foreach_norm`` per (device, dtype) instead of a norm, a copy and a
    host sync per piece; each value equals ``vector_norm(g, 2, dtype=wd).double().square()``.
    Callers that stream pieces (gradients on disk) call it once per batch they hold."""
    items = list(parts)
    out: list[tuple[float, bool]] = [(0.0, False)] * len(items)
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for i, (g, _) in enumerate(items):
        groups.setdefault((g.device, g.dtype), []).append(i)
    for (_, dtype), idx in groups.items():
        wd = torch.promote_types(dtype, torch.float32)  # fp64 gradients keep fp64
        norms = torch._foreach_norm([items[i][0] for i in idx], 2, dtype=wd)
        squares = torch.stack(norms).double().square().cpu().tolist()
        for i, sq in zip(idx, squares, strict=True):
            rec = items[i][1]
            out[i] = (sq, rec is None or rec.counted_here)
    return out


def reduce_squares(
    squares: Iterable[tuple[float, bool]],
    *,
    group: dist.ProcessGroup | None = None,
    shardings: Mapping[str, ParamSharding] | None = None,
) -> GradNorm:
    """``mesh_grad_norm`` from ``piece_squares``' output: sums the counted squares in order and
    counts the non-finite pieces, then all-reduces the pair. Collective, as ``mesh_grad_norm``."""
    sumsq, bad = 0.0, 0
    for sq, counted in squares:
        if not math.isfinite(sq):
            bad += 1
        if counted:
            sumsq += sq
    total = torch.tensor([sumsq, float(bad)], dtype=torch.float64)
    axes: list[ShardAxis] = sharding_axes(shardings) if shardings else []
    groups = [group] if group is not None else []
    groups += [a.group for a in axes if a.size > 1]
    for g in groups:
        if dist.get_world_size(g) > 1:
            total = _all_reduce(total, g)
    sumsq, bad_total = float(total[0]), float(total[1])
    overflow = bad_total > 0 or not math.isfinite(sumsq)
    norm = math.sqrt(sumsq) if math.isfinite(sumsq) else sumsq
    return GradNorm(float("inf") if overflow and math.isfinite(norm) else norm, overflow)


def _all_reduce(t: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    if dist.get_backend(group) == "nccl":  # NCCL reduces CUDA tensors only
        t = t.cuda()
    dist.all_reduce(t, group=group)
    return t.cpu()
