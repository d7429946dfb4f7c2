"""How a parameter is laid out over the process mesh, beyond data parallelism.

[Note: mesh-wide norms] The global gradient norm of a model split over a mesh counts every
element of the unsharded model once. A parameter *split* along an axis holds a different piece
on every rank of that axis: each piece counts. A parameter *replicated* along an axis holds the
same value (and gradient) on every rank of it: only the rank at coordinate 0 counts it. Sums of
squares are then all-reduced over the data-parallel group and over every axis that any
parameter names, so every rank of the mesh agrees on the norm and on an overflow. Optimizers
learn the layout through ``ParamSharding`` records keyed by parameter name; they need not know
which tensor-parallel layers produced them (colossal-zero does not import colossal-parallel).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["ParamSharding", "ShardAxis", "sharding_axes"]


@dataclass(frozen=True)
class ShardAxis:
    """One mesh axis as this rank sees it.

    Attributes:
        name: the axis name ("tp", "row", "col", "dep", "pp", ...); axes are told apart by it.
        group: the ``torch.distributed`` process group of this rank's neighbours along it.
        size: ranks along the axis.
        coord: this rank's coordinate along it (its rank inside ``group``).
    """

    name: str
    group: Any  # torch.distributed.ProcessGroup (kept untyped: contracts needs no dist)
    size: int
    coord: int


@dataclass(frozen=True)
class ParamSharding:
    """Which axes one parameter is split along and which it is replicated over.

    Attributes:
        split: axes whose ranks hold disjoint pieces of the parameter.
        replicated: axes whose ranks hold identical copies.
    """

    split: tuple[ShardAxis, ...] = ()
    replicated: tuple[ShardAxis, ...] = ()

    @property
    def counted_here(self) -> bool:
        """True on exactly one rank of each set of replicas (see [Note: mesh-wide norms])."""
        return all(a.coord == 0 for a in self.replicated)


def sharding_axes(
    shardings: Mapping[str, ParamSharding] | Iterable[ParamSharding],
) -> list[ShardAxis]:
    """Every axis the records name, once each, sorted by name (the order to reduce over)."""
    records = shardings.values() if isinstance(shardings, Mapping) else shardings
    seen: dict[str, ShardAxis] = {}
    for rec in records:
        for axis in (*rec.split, *rec.replicated):
            seen.setdefault(axis.name, axis)
    return [seen[n] for n in sorted(seen)]
