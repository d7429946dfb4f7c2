"""Tensor-parallel sharding rules shared by the model plans (private)."""

from __future__ import annotations

from colossal_contracts import ConfigError
from colossal_parallel import TP_MODES, ProcessMesh

from ._base import TpLayers, interleave_rows
from ._grid import GridLayers
from ._layers1d import Layers1D

__all__ = ["TpLayers", "build_layers", "interleave_rows"]


def build_layers(mesh: ProcessMesh, mode: str | None, *, sequence_parallel: bool) -> TpLayers:
    """The sharding rules of ``mode`` (default: the mesh's); ``ConfigError`` on a mismatch."""
    if not isinstance(mesh, ProcessMesh):
        raise ConfigError(f"parallelize needs a ProcessMesh, got {type(mesh).__name__}")
    have = mesh.config.tp_mode
    mode = have if mode is None else mode
    if mode not in TP_MODES:
        raise ConfigError(f"unknown tensor-parallel mode {mode!r}; choose one of {TP_MODES}")
    if mode != have:
        raise ConfigError(
            f"parallelize mode {mode!r} does not match the mesh's tp_mode {have!r}; build the "
            f"mesh with MeshConfig(tp_mode={mode!r}, ...)"
        )
    if sequence_parallel and mode != "1d":
        raise ConfigError(
            f"sequence parallelism is the 1d mode's (Megatron); {mode} splits the batch instead. "
            "Use mode='1d' or sequence_parallel=False"
        )
    if mode == "1d":
        return Layers1D(mesh, sequence_parallel=sequence_parallel)
    return GridLayers(mesh)
