"""``parallelize``: one verb for every model of the package; dispatches to the model's plan."""

from __future__ import annotations

from torch import nn

from colossal_contracts import ConfigError
from colossal_parallel import ProcessMesh

from .gpt.model import GPT
from .gpt.parallelize import parallelize_gpt
from .palm.model import PaLM
from .palm.parallelize import parallelize_palm

__all__ = ["parallelize"]


def parallelize(
    model: nn.Module,
    mesh: ProcessMesh,
    mode: str | None = None,
    *,
    sequence_parallel: bool = False,
    activation_checkpointing: bool = False,
) -> nn.Module:
    """Shard ``model`` (a ``GPT`` or ``PaLM``) in place for tensor parallelism; returns it.

    ``mode`` ("1d", "2d", "2.5d", "3d") defaults to ``mesh.config.tp_mode`` and must match it.
    ``sequence_parallel`` (1d only) splits the residual stream along the sequence (Megatron).
    ``activation_checkpointing`` recomputes each block in backward. Every rank passes the same
    unsharded model; the result takes the full ids on every rank and gives the same loss on all.
    """
    kwargs = dict(
        sequence_parallel=sequence_parallel, activation_checkpointing=activation_checkpointing
    )
    if isinstance(model, GPT):
        return parallelize_gpt(model, mesh, mode, **kwargs)
    if isinstance(model, PaLM):
        return parallelize_palm(model, mesh, mode, **kwargs)
    raise ConfigError(
        f"parallelize knows GPT and PaLM, got {type(model).__name__}; for other models use the "
        "colossal_parallel layers directly"
    )
