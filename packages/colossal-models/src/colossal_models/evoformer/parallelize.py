"""Dynamic axial parallelism (DAP) plan of the ``Evoformer`` (FastFold, Cheng et al., 2022).

[Note: DAP layout] Across the p ranks of one mesh axis, between operations, the MSA
representation m (B, S, R, c_m) is split along its sequences (each rank holds S/p rows) and the
pair representation z (B, R, R, c_z) along its first residue axis (R/p rows i). Row-wise work
(MSA row attention, outgoing triangular update, starting-node attention) runs on rows; before
column-wise work (MSA column attention, transition and outer product mean; incoming update,
ending-node attention and pair transition) one all-to-all moves the split to the other axis,
and another moves it back. Parameters are replicated; a gradient hook sums each parameter's
gradient over the axis, so every rank ends backward with the single-process gradient. The stack
takes whole m and z on every rank, splits them on entry and gathers them on exit.

Per block, forward, counted bytes (see [Note: counted bytes]; 4-byte floats, B batch):

- all_to_all: 2 switches of m, 4 of z, each counting its local input:
  ``(2 * B*S*R*c_m + 4 * B*R*R*c_z) * 4 / p``
- all_gather (output bytes): pair biases of MSA row attention and of both triangular attentions,
  ``B*R*R*(msa_heads + 2*pair_heads) * 4``; outer-product-mean b, ``B*S*R*c_hidden_opm * 4``;
  one projection per triangular update, ``2 * B*R*R*c_hidden_mul * 4``.

Backward counts the same all_to_all bytes again, reduce_scatter bytes equal to the forward's
all_gather bytes, and an all_reduce of every parameter's gradient. ``dap_comm_bytes`` is the
formula; the tests compare the counter with it.

Overlap: the all-to-all that returns m to rows is started after the outer product mean and
waited for at the end of the block, so it runs behind the whole pair stack; in backward its
inverse starts at the block's end and is waited for after the pair stack's backward. The other
switches and the gathers feed the very next operation and stay synchronous.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from colossal_contracts import ConfigError
from colossal_parallel import (
    CountedComm,
    ProcessMesh,
    gather_along,
    split_along,
    switch_shard_dim,
    switch_shard_dim_async,
)

from .config import EvoformerConfig
from .model import Evoformer, LocalAxes

__all__ = ["DapAxes", "dap_comm_bytes", "parallelize_evoformer"]


class DapAxes(LocalAxes):
    """The distributed axes of [Note: axial layout]: p ranks of ``axis`` share m and z."""

    def __init__(self, mesh: ProcessMesh, axis: str):
        self.comm: CountedComm = mesh.comm
        self.axis = axis
        self.size = mesh.size(axis)

    def gather(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        # every rank's consumer saw different rows: the gradient is reduce-scattered back
        return gather_along(x, self.comm, self.axis, dim % x.dim(), grad="reduce_scatter")

    def switch(self, x: torch.Tensor, from_dim: int, to_dim: int) -> torch.Tensor:
        return switch_shard_dim(x, self.comm, self.axis, from_dim=from_dim, to_dim=to_dim)

    def switch_start(
        self, x: torch.Tensor, from_dim: int, to_dim: int
    ) -> Callable[[], torch.Tensor]:
        return switch_shard_dim_async(x, self.comm, self.axis, from_dim=from_dim, to_dim=to_dim)

    def enter(self, m: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        p = self.size
        n_seq, n_res = m.shape[1], z.shape[1]
        if n_seq % p or n_res % p:
            raise ConfigError(
                f"dynamic axial parallelism over {p} ranks needs MSA depth and residue count "
                f"divisible by {p}, got S={n_seq}, R={n_res}; pad them or use a divisor of both"
            )
        return split_along(m, self.comm, self.axis, 1), split_along(z, self.comm, self.axis, 1)

    def leave(self, m: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return gather_along(m, self.comm, self.axis, 1), gather_along(z, self.comm, self.axis, 1)


def parallelize_evoformer(
    model: Evoformer, mesh: ProcessMesh, *, axis: str = "tp", sync_grads: bool = True
) -> Evoformer:
    """Run ``model`` with dynamic axial parallelism over ``mesh``'s ``axis``; returns it.

    Every rank passes the same model (same seed) and the same whole m and z; each computes its
    shard ([Note: DAP layout]) and the forward returns whole tensors everywhere. With
    ``sync_grads`` a hook all-reduces each parameter's gradient over ``axis`` during backward.
    Raises ``ConfigError`` (before any collective) at forward when S or R is not divisible by p.
    """
    if not isinstance(model, Evoformer):
        raise ConfigError(f"parallelize_evoformer takes an Evoformer, got {type(model).__name__}")
    if isinstance(model.axes, DapAxes):
        raise ConfigError(
            "parallelize_evoformer: this Evoformer is already parallelized (its gradient hooks "
            "would sum twice); build a fresh model to change the mesh or axis"
        )
    axes = DapAxes(mesh, axis)
    model.axes = axes
    for block in model.blocks:
        block.axes = axes
    if sync_grads and axes.size > 1:
        # block parameters see 1/p of the data each; the single projection sees the gathered m
        # on every rank and already has the whole gradient
        for p in model.blocks.parameters():
            if p.requires_grad:
                p.register_hook(_grad_sum(axes))
    return model


def _grad_sum(axes: DapAxes) -> Callable[[torch.Tensor], torch.Tensor]:
    def hook(g: torch.Tensor) -> torch.Tensor:
        return axes.comm.all_reduce(g, axes.axis)

    return hook


def dap_comm_bytes(
    cfg: EvoformerConfig,
    *,
    batch: int,
    num_seq: int,
    num_res: int,
    p: int,
    backward: bool = False,
    input_grads: bool = True,
    elem_bytes: int = 4,
) -> dict[str, int]:
    """Counted bytes per op of one forward (and backward) of ``Evoformer(cfg)`` under DAP over p
    ranks ([Note: DAP layout]); the entry and exit split/gather of the stack are included, and
    with ``input_grads`` the gathering of the inputs' gradients at the entry split."""
    if p == 1:
        return {}
    B, S, R, e = batch, num_seq, num_res, elem_bytes
    a2a = cfg.num_blocks * (2 * B * S * R * cfg.c_m + 4 * B * R * R * cfg.c_z) * e // p
    heads = cfg.msa_heads + 2 * cfg.pair_heads
    gathers = B * R * R * heads + B * S * R * cfg.c_hidden_opm + 2 * B * R * R * cfg.c_hidden_mul
    out = {
        "all_to_all": a2a,
        # per block, plus the exit gather of m and z (output bytes)
        "all_gather": cfg.num_blocks * gathers * e
        + (B * S * R * cfg.c_m + B * R * R * cfg.c_z) * e,
    }
    if backward:
        out["all_to_all"] *= 2
        out["reduce_scatter"] = cfg.num_blocks * gathers * e
        if input_grads:  # the entry split's backward gathers the input gradients
            out["all_gather"] += (B * S * R * cfg.c_m + B * R * R * cfg.c_z) * e
        out["all_reduce"] = cfg.num_blocks * sum(cfg.block_params().values()) * e
    return out
