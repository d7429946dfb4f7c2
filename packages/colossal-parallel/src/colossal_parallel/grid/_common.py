"""Checks and deterministic initialisation shared by the multi-dimensional layers."""

from __future__ import annotations

import torch

from colossal_contracts import ConfigError

from .._mesh import ProcessMesh

__all__ = ["block_generator", "check_last_dim", "check_mode"]


def check_mode(mesh: ProcessMesh, mode: str, what: str) -> None:
    """``ConfigError`` unless ``mesh`` is a ProcessMesh whose tensor-parallel mode is ``mode``."""
    if not isinstance(mesh, ProcessMesh):
        raise ConfigError(f"{what} needs a ProcessMesh, got {type(mesh).__name__}")
    if mesh.config.tp_mode != mode:
        raise ConfigError(
            f"{what} needs a mesh with tp_mode={mode!r}, got tp_mode={mesh.config.tp_mode!r}; "
            f"build the mesh with MeshConfig(tp_mode={mode!r}, ...) or use the layer of that mode"
        )


def check_last_dim(x: torch.Tensor, expected: int, what: str, *, min_dim: int = 2) -> None:
    """``ConfigError`` (before any collective) unless ``x`` has ``min_dim`` dims and last ``expected``."""
    if x.dim() < min_dim or x.shape[-1] != expected:
        raise ConfigError(
            f"{what}: expected a local block of shape (batch, ..., {expected}) with at least "
            f"{min_dim} dims, got {tuple(x.shape)}; split the input with split_to_layout first"
        )


def block_generator(
    mesh: ProcessMesh, seed: int, axes: tuple[str, ...], tag: int
) -> torch.Generator:
    """A generator that is the same on the ranks that hold the same block of a parameter.

    ``axes`` are the axes whose coordinates tell blocks apart (replica axes left out), ``tag``
    tells the parameters of one layer apart. No communication is needed to keep replicas equal.
    """
    block = 0
    for a in axes:
        block = block * mesh.size(a) + mesh.coord(a)
    g = torch.Generator()
    g.manual_seed((seed * 1_000_003 + tag * 10_007 + block) % (2**63 - 1))
    return g
