"""colossal-parallel: process meshes, torchrun launch, counted collectives and tensor parallelism."""

from ._autograd import (
    copy_to_axis,
    gather_along,
    local_chunk,
    reduce_from_axis,
    reduce_scatter_along,
    split_along,
)
from ._comm import CountedComm
from ._config import TP_MODES, MeshConfig, TpMode, divide
from ._counter import COMM_OPS, CommCounter, CommStat
from ._launch import LaunchInfo, launch_from_torch, seed_everything
from ._mesh import ProcessMesh

__version__ = "0.1.0"

__all__ = [
    "COMM_OPS",
    "TP_MODES",
    "CommCounter",
    "CommStat",
    "CountedComm",
    "LaunchInfo",
    "MeshConfig",
    "ProcessMesh",
    "TpMode",
    "copy_to_axis",
    "divide",
    "gather_along",
    "launch_from_torch",
    "local_chunk",
    "reduce_from_axis",
    "reduce_scatter_along",
    "seed_everything",
    "split_along",
]

# --- multi-dimensional tensor parallelism (2D / 2.5D / 3D): names exported by that work ---
# (keep additions to this block; extend __all__ here with `__all__ += [...]`)
# --- end multi-dimensional block ---
