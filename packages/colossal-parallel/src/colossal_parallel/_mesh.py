"""``ProcessMesh``: named parallel axes over torch.distributed, one process group per axis.

The mesh is an ordinary object passed to whatever uses it; nothing is stored in module globals.
Every rank must build the same meshes in the same order (process-group creation is collective).
The layout is described in [Note: rank layout] in ``_config.py``.
"""

from __future__ import annotations

import itertools
import math

import torch.distributed as dist

from colossal_contracts import ConfigError, DistributedError

from ._comm import CountedComm
from ._config import MeshConfig
from ._group_cache import shared_group

__all__ = ["ProcessMesh"]


def _unravel(rank: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    coords = []
    for size in reversed(shape):
        coords.append(rank % size)
        rank //= size
    return tuple(reversed(coords))


def _ravel(coords: tuple[int, ...], shape: tuple[int, ...]) -> int:
    rank = 0
    for c, size in zip(coords, shape):
        rank = rank * size + c
    return rank


class ProcessMesh:
    """The process groups of a ``MeshConfig`` on the current torch.distributed world.

    ``size(axis)``, ``coord(axis)``, ``group(axis)`` and ``ranks(axis)`` answer for every name in
    ``config.axes``; ``ranks(axis)`` lists the global ranks of this rank's group ordered by their
    coordinate along the axis, which is also their rank inside ``group(axis)``. ``comm`` is the
    counted-collective layer bound to this mesh (every collective of the package goes through it).
    """

    config: MeshConfig
    rank: int
    world_size: int
    comm: CountedComm
    _layout_axes: tuple[str, ...]  # ("pp", "dp", "sp", *tp_layout), outermost first
    _layout_shape: tuple[int, ...]
    _coords: tuple[int, ...]  # this rank's coordinate per layout axis
    _groups: dict[str, dist.ProcessGroup]
    _ranks: dict[str, list[int]]

    def __init__(self, config: MeshConfig) -> None:
        if not isinstance(config, MeshConfig):
            raise ConfigError(f"ProcessMesh needs a MeshConfig, got {type(config).__name__}")
        if not dist.is_available() or not dist.is_initialized():
            raise DistributedError(
                "ProcessMesh needs torch.distributed initialised; call launch_from_torch() (under "
                "torchrun) or torch.distributed.init_process_group() first"
            )
        world_size = dist.get_world_size()
        config.validate(world_size)  # before any collective: a bad size never half-builds groups
        self.config = config
        self.rank = dist.get_rank()
        self.world_size = world_size
        self._layout_axes = ("pp", "dp", "sp", *config.tp_layout)
        self._layout_shape = (config.pp, config.dp, config.sp, *config.tp_shape)
        self._coords = _unravel(self.rank, self._layout_shape)
        self._groups = {}
        self._ranks = {}
        for axis in config.axes:
            self._build_axis(axis)
        self.comm = CountedComm(self)

    def _axis_dims(self, axis: str) -> tuple[int, ...]:
        """Indices into the layout of the dims an axis spans (several for the flattened ``tp``)."""
        if axis in self._layout_axes:
            return (self._layout_axes.index(axis),)
        if axis == "tp":
            return tuple(range(3, len(self._layout_axes)))
        if axis == "dp_sp" and self.config.sp > 1:  # adjacent in the layout: (pp, dp, sp, ...)
            return (1, 2)
        raise ConfigError(
            f"unknown mesh axis {axis!r}; this {self.config.tp_mode} mesh has axes "
            f"{self.config.axes}"
        )

    def _build_axis(self, axis: str) -> None:
        dims = self._axis_dims(axis)
        shape = self._layout_shape
        others = [d for d in range(len(shape)) if d not in dims]
        # Every rank asks for every group of this axis, in the same order (creation is collective;
        # a rank set another mesh of this world already has is reused: [Note: shared groups]).
        for fixed in itertools.product(*(range(shape[d]) for d in others)):
            members = []
            for varying in itertools.product(*(range(shape[d]) for d in dims)):
                coords = [0] * len(shape)
                for d, c in zip(others, fixed):
                    coords[d] = c
                for d, c in zip(dims, varying):
                    coords[d] = c
                members.append(_ravel(tuple(coords), shape))
            group = shared_group(members)
            if self.rank in members:
                self._groups[axis] = group
                self._ranks[axis] = members

    @property
    def axes(self) -> tuple[str, ...]:
        """Every axis name this mesh answers to."""
        return self.config.axes

    def size(self, axis: str) -> int:
        """Number of ranks along ``axis``."""
        return math.prod(self._layout_shape[d] for d in self._axis_dims(axis))

    def coord(self, axis: str) -> int:
        """This rank's coordinate along ``axis`` (its rank inside ``group(axis)``)."""
        dims = self._axis_dims(axis)
        sub = tuple(self._coords[d] for d in dims)
        return _ravel(sub, tuple(self._layout_shape[d] for d in dims))

    def group(self, axis: str) -> dist.ProcessGroup:
        """The process group of this rank's neighbours along ``axis``."""
        self._axis_dims(axis)
        return self._groups[axis]

    def ranks(self, axis: str) -> list[int]:
        """Global ranks of ``group(axis)``, ordered by coordinate along ``axis``."""
        self._axis_dims(axis)
        return list(self._ranks[axis])

    def global_rank(self, axis: str, coord: int) -> int:
        """Global rank of the member of this rank's ``axis`` group at ``coord``."""
        members = self.ranks(axis)
        if not 0 <= coord < len(members):
            raise ConfigError(f"coordinate {coord} is outside axis {axis!r} of size {len(members)}")
        return members[coord]

    def close(self) -> None:
        """Let go of this mesh's process groups. They are the world's shared groups and stay
        alive for the next mesh ([Note: shared groups]); ``release_shared_groups()`` destroys
        them. The mesh answers no ``group()`` after."""
        self._groups.clear()

    def __repr__(self) -> str:
        c = self.config
        coords = ", ".join(f"{a}={self.coord(a)}" for a in self._layout_axes)
        return (
            f"ProcessMesh(rank={self.rank}, {c.tp_mode}, dp={c.dp}, pp={c.pp}, sp={c.sp}, "
            f"tp={c.tp}: {coords})"
        )
