"""Key/value projections with fewer heads than the ranks that share a layer.

[Note: shared key/value heads] With ``K`` key/value heads, ``H`` query heads and ``p`` ranks
splitting the heads, query head ``h`` reads key/value head ``h // (H/K)``. When ``p`` divides
``K`` the key/value projection splits like any column projection. When ``K`` divides ``p``
(multi-query attention: ``K = 1``) rank ``r``'s query heads all read key/value head
``r // (p/K)``: the projection is still stored split over the ranks (each weight element once),
its output is all-gathered and the rank keeps its head. Backward reduce-scatters the gradient of
the gathered output, which sums the contributions of every rank that read a head.
"""

from __future__ import annotations

import torch
from torch import nn

from colossal_contracts import ConfigError
from colossal_parallel import ProcessMesh, gather_along

__all__ = ["GatheredKV", "kv_sharing", "original_names"]


def kv_sharing(num_heads: int, num_kv_heads: int, parts: int, what: str) -> int | None:
    """``None`` when the key/value heads split over ``parts``; else ranks per key/value head."""
    if num_kv_heads % parts == 0:
        return None
    if parts % num_kv_heads == 0:
        return parts // num_kv_heads
    raise ConfigError(
        f"{what}: {num_kv_heads} key/value heads neither split over nor divide the {parts} "
        "tensor-parallel ranks of a layer; use a key/value head count that is a multiple or a "
        f"divisor of {parts}"
    )


class GatheredKV(nn.Module):
    """``linear`` (output split over ``axis``), all-gathered, keeping key/value head ``index``.

    See [Note: shared key/value heads]. ``head_width`` is the width of one key/value head.
    """

    def __init__(
        self, linear: nn.Module, mesh: ProcessMesh, axis: str, *, index: int, head_width: int
    ) -> None:
        super().__init__()
        self.linear = linear
        self.mesh, self.axis = mesh, axis
        self.index, self.head_width = index, head_width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)  # (..., K*D / p)
        y = gather_along(y, self.mesh.comm, self.axis, -1, grad="reduce_scatter")  # (..., K*D)
        d = self.head_width
        return y[..., self.index * d : (self.index + 1) * d]  # (..., D)

    def extra_repr(self) -> str:
        return f"axis={self.axis}, keeps key/value head {self.index}"


def original_names(model: nn.Module) -> dict[str, str]:
    """Parameter name -> the name it had before ``parallelize``: a ``GatheredKV`` holds the
    projection it wraps as ``linear``, so ``attn.k.linear.weight`` was ``attn.k.weight``; every
    other name is its own. What optimizer groups and user-facing names are keyed by."""
    wrapped = [f"{p}." if p else "" for p, m in model.named_modules() if isinstance(m, GatheredKV)]
    out = {}
    for name, _ in model.named_parameters():
        prefix = next((w for w in wrapped if name.startswith(f"{w}linear.")), None)
        out[name] = name if prefix is None else prefix + name[len(prefix) + len("linear.") :]
    return out
