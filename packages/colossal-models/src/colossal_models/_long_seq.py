"""``apply_sequence_parallel``: a GPT or PaLM whose sequences are split over the mesh's ``sp``
axis, with ring attention or Ulysses in every attention layer.

Each ``sp`` rank keeps its slice of the ids and targets ([Note: sequence layouts] in
colossal_parallel: zigzag for ring attention, contiguous for Ulysses), embeds them at their own
positions (learned positions, or rotary tables indexed by position), runs every block on its
slice (only attention mixes tokens, through the swapped-in core) and takes the loss over its
tokens. The reported loss is the mean over all tokens, the same on every ``sp`` rank; backward
gives each rank the gradient of its own tokens' share, so replicated parameters must have their
gradients *summed* over ``sp`` (``all_reduce_grads(..., "sp", average=False)``), and averaged
over ``dp`` as usual.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from colossal_contracts import ConfigError
from colossal_parallel import ProcessMesh, gather_along, reduce_from_axis
from colossal_parallel.sequence import (
    check_sequence,
    ring_attention,
    sequence_positions,
    ulysses_attention,
)

from ._io import LMIO
from ._tp._layers1d import IO1D
from .gpt.model import GPT
from .palm.model import PaLM

__all__ = ["RingAttentionCore", "SequenceIO", "UlyssesCore", "apply_sequence_parallel"]

AXIS = "sp"
SEQ = 1  # (B, T) ids and (B, T, C) activations: the sequence dim


def _no_dropout(dropout_p: float, what: str) -> None:
    if dropout_p > 0.0:
        raise ConfigError(f"{what} has no attention dropout; set the model's dropout to 0")


class RingAttentionCore(nn.Module):
    """Ring attention over the ``sp`` ranks (zigzag layout) in place of ``CausalAttention``."""

    def __init__(self, mesh: ProcessMesh) -> None:
        super().__init__()
        self.mesh = mesh

    def forward(self, q, k, v, dropout_p: float = 0.0) -> torch.Tensor:
        _no_dropout(dropout_p, "ring attention")
        return ring_attention(q, k, v, self.mesh.comm, axis=AXIS, layout="zigzag")


class UlyssesCore(nn.Module):
    """Ulysses all-to-all attention over the ``sp`` ranks in place of ``CausalAttention``."""

    def __init__(self, mesh: ProcessMesh) -> None:
        super().__init__()
        self.mesh = mesh

    def forward(self, q, k, v, dropout_p: float = 0.0) -> torch.Tensor:
        return ulysses_attention(q, k, v, self.mesh.comm, axis=AXIS, dropout_p=dropout_p)


class SequenceIO(LMIO):
    """Ids, targets and positions of this rank's slice; the loss is the mean over every token.
    ``inner`` is the boundary it splits: the unsharded one, or 1D tensor parallelism's
    vocabulary-parallel head (``IO1D``), which computes each slice's logits and loss."""

    def __init__(self, mesh: ProcessMesh, layout: str, inner: LMIO | None = None) -> None:
        super().__init__()
        self.mesh, self.layout = mesh, layout
        self.inner = inner if inner is not None else LMIO()

    def _index(self, seq_len: int, device: torch.device) -> torch.Tensor:
        size, coord = self.mesh.size(AXIS), self.mesh.coord(AXIS)
        return sequence_positions(seq_len, size, coord, self.layout, device)

    def tokens(self, idx, targets):
        check_sequence(idx.shape[SEQ], self.mesh.size(AXIS), self.layout)
        index = self._index(idx.shape[SEQ], idx.device)
        return idx[:, index], None if targets is None else targets[:, index]

    def positions(self, seq_len: int, device: torch.device) -> torch.Tensor:
        return self._index(seq_len, device)

    def enter(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner.enter(x)

    def forward(self, h, weight, targets):
        out = self.inner(h, weight, targets)  # this slice's logits (B, T/sp, V) or mean loss
        if targets is None:
            return self._in_order(out)
        # the mean over every token; backward: 1/sp of the local loss
        return reduce_from_axis(out, self.mesh.comm, AXIS) / self.mesh.size(AXIS)

    def _in_order(self, logits: torch.Tensor) -> torch.Tensor:
        """Whole-sequence logits from every rank's slice, back in position order."""
        size = self.mesh.size(AXIS)
        full = gather_along(logits, self.mesh.comm, AXIS, SEQ)
        seq_len = full.shape[SEQ]
        order = torch.cat(
            [sequence_positions(seq_len, size, r, self.layout, full.device) for r in range(size)]
        )
        return full[:, torch.argsort(order)]


def apply_sequence_parallel(
    model: nn.Module, mesh: ProcessMesh, method: Literal["ring", "ulysses"] = "ring"
) -> nn.Module:
    """Split ``model``'s sequences over ``mesh``'s ``sp`` axis in place; returns it.

    ``method`` "ring" (zigzag layout, any head count) or "ulysses" (contiguous layout, heads per
    tp rank a multiple of sp). Composes with 1d tensor parallelism (apply it after
    ``parallelize``; the vocabulary-parallel head computes each slice's loss), also with its
    Megatron sequence parallelism (each rank's ``T / sp`` slice is split again over the tp ranks
    outside attention, gathered back for it), and with pipeline stages (``split_into_stages``
    after it: activations between stages are ``T / sp`` long).
    ``ConfigError`` before any collective for an unknown method, a head count Ulysses cannot
    split, or a grid tensor-parallel mode.
    """
    if not isinstance(model, (GPT, PaLM)):
        raise ConfigError(f"apply_sequence_parallel knows GPT and PaLM, got {type(model).__name__}")
    if method not in ("ring", "ulysses"):
        raise ConfigError(f"long-sequence method must be 'ring' or 'ulysses', got {method!r}")
    io = model.io
    plain = type(io) is LMIO and mesh.size("tp") == 1
    tp1d = isinstance(io, IO1D) and mesh.config.tp_mode == "1d"
    if not (plain or tp1d):
        raise ConfigError(
            "apply_sequence_parallel composes with data, pipeline and 1d tensor parallelism "
            "(with or without Megatron sequence parallelism); apply it to an unsharded model or "
            "after parallelize on a 1d mesh"
        )
    sp, heads = mesh.size(AXIS), model.config.num_heads // mesh.size("tp")  # heads per tp rank
    if method == "ulysses" and heads % sp:
        raise ConfigError(
            f"Ulysses splits the {heads} attention heads of each tp rank over sp={sp} ranks; use "
            f"a head count that is a multiple of {sp} * tp, a smaller sp, or method='ring'"
        )
    model.io = SequenceIO(mesh, "zigzag" if method == "ring" else "contiguous", io)
    for block in model.blocks:
        block.attn.core = RingAttentionCore(mesh) if method == "ring" else UlyssesCore(mesh)
    return model
