"""colossal-parallel: process meshes, torchrun launch, counted collectives, and the subpackages
``tp1d`` (Megatron 1D), ``grid`` (2D/2.5D/3D), ``pipeline`` and ``sequence`` (ring, Ulysses)."""

from . import grid, pipeline, sequence, tp1d
from ._autograd import (
    copy_to_axis,
    gather_along,
    reduce_from_axis,
    reduce_scatter_along,
    split_along,
)
from ._axial import switch_shard_dim, switch_shard_dim_async
from ._comm import CountedComm
from ._config import TP_MODES, MeshConfig, TpMode
from ._counter import CommCounter, CommStat
from ._grads import all_reduce_grads
from ._group_cache import release_shared_groups
from ._launch import launch_from_torch, seed_everything
from ._mesh import ProcessMesh
from ._p2p import exchange
from ._torch_op import torch_function_op

__version__ = "0.1.0"

__all__ = [
    "TP_MODES",
    "CommCounter",
    "CommStat",
    "CountedComm",
    "MeshConfig",
    "ProcessMesh",
    "TpMode",
    "all_reduce_grads",
    "copy_to_axis",
    "exchange",
    "gather_along",
    "grid",
    "launch_from_torch",
    "pipeline",
    "reduce_from_axis",
    "reduce_scatter_along",
    "release_shared_groups",
    "seed_everything",
    "sequence",
    "split_along",
    "switch_shard_dim",
    "switch_shard_dim_async",
    "torch_function_op",
    "tp1d",
]
