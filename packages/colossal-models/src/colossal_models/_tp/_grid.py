"""2D (SUMMA), 2.5D (Tesseract) and 3D (cube) tensor parallelism for decoder layers.

Activations carry a ``TpLayout``: the batch is split over the layout's row axes and the hidden
dim over its hidden axis; the sequence is never split, so attention runs on local heads without
communication. In 3D each Linear swaps the layout (``LAYOUT_3D`` <-> ``LAYOUT_3D_T``): column
projections take ``LAYOUT_3D`` and row projections take ``LAYOUT_3D_T``, so the residual stream
stays in ``LAYOUT_3D``.

[Note: grid tied head] The token embedding keeps the whole vocabulary with its columns split
(``Embedding*D``), so the same weight can serve as the head: the ranks of a hidden block gather
its columns (gradient reduce-scattered, as the embedding does), multiply the local rows by it,
and reduce-scatter the partial logits over the vocabulary along the hidden axis. The logits then
have the stream's layout with the vocabulary in place of the hidden dim.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from colossal_contracts import ConfigError
from colossal_parallel import (
    ProcessMesh,
    copy_to_axis,
    gather_along,
    reduce_scatter_along,
    torch_function_op,
)
from colossal_parallel.grid import (
    LAYOUT_2D,
    LAYOUT_2P5D,
    LAYOUT_3D,
    LAYOUT_3D_T,
    Classifier2D,
    Classifier2p5D,
    Classifier3D,
    Embedding2D,
    Embedding2p5D,
    Embedding3D,
    LayerNorm2D,
    LayerNorm2p5D,
    LayerNorm3D,
    Linear2D,
    Linear2p5D,
    Linear3D,
    TpLayout,
    cross_entropy_2d,
    cross_entropy_2p5d,
    cross_entropy_3d,
    gather_from_layout,
    split_to_layout,
)

from .._io import LMIO, at_least_fp32
from ._base import TpLayers
from ._kv import GatheredKV, kv_sharing

__all__ = ["GridIO", "GridLayers", "grid_tied_logits"]

Loss = Callable[[torch.Tensor, torch.Tensor, ProcessMesh, TpLayout], torch.Tensor]


@dataclass(frozen=True)
class _Kit:
    """The colossal-parallel classes of one mode and the layouts its plan uses.

    Attributes:
        linear, norm, embedding, classifier: layer classes of the mode.
        stream: layout of the residual stream (and of column-projection inputs).
        row_input: layout of row-projection inputs (the column outputs).
        loss: cross-entropy of vocabulary-parallel logits of a given layout.
    """

    linear: type[nn.Module]
    norm: type[nn.Module]
    embedding: type[nn.Module]
    classifier: type[nn.Module]
    stream: TpLayout
    row_input: TpLayout
    loss: Loss


_KITS: dict[str, _Kit] = {
    "2d": _Kit(
        Linear2D,
        LayerNorm2D,
        Embedding2D,
        Classifier2D,
        LAYOUT_2D,
        LAYOUT_2D,
        lambda lg, t, m, lay: cross_entropy_2d(lg, t, m),
    ),
    "2.5d": _Kit(
        Linear2p5D,
        LayerNorm2p5D,
        Embedding2p5D,
        Classifier2p5D,
        LAYOUT_2P5D,
        LAYOUT_2P5D,
        lambda lg, t, m, lay: cross_entropy_2p5d(lg, t, m),
    ),
    "3d": _Kit(
        Linear3D,
        LayerNorm3D,
        Embedding3D,
        Classifier3D,
        LAYOUT_3D,
        LAYOUT_3D_T,
        lambda lg, t, m, lay: cross_entropy_3d(lg, t, m, layout=lay),
    ),
}


@torch_function_op  # one operator over the tied weight (colossal-parallel's [Note: operators a mode sees])
def grid_tied_logits(
    h: torch.Tensor, weight: torch.Tensor, mesh: ProcessMesh, layout: TpLayout
) -> torch.Tensor:
    """Vocabulary-parallel logits ``(b, T, V / q)`` from a stream block ``h (b, T, C / q)`` and a
    column-split embedding weight ``(V, C / (q * q_chunk))`` (see [Note: grid tied head])."""
    comm = mesh.comm
    w = weight
    for a in layout.replica_axes:
        w = copy_to_axis(w, comm, a)
    w = gather_along(w, comm, layout.chunk_axis, 1, grad="reduce_scatter")  # (V, C/q)
    partial = F.linear(h, w)  # (b, T, V), summed over hidden blocks below
    return reduce_scatter_along(partial, comm, layout.hidden_axis, -1)  # (b, T, V/q)


class GridIO(LMIO):
    """Ids and targets cut to this rank's batch chunk; logits vocabulary-parallel; grid loss.

    ``head`` is the sharded untied classifier (held by the model as ``lm_head``; referenced here,
    not registered, so it appears once in the state dict), or None for the tied head.
    """

    def __init__(
        self, mesh: ProcessMesh, layout: TpLayout, loss: Loss, head: nn.Module | None
    ) -> None:
        super().__init__()
        self.mesh, self.layout, self.loss = mesh, layout, loss
        self._head = (head,) if head is not None else ()
        self.logits_layout: TpLayout = head.out_layout if head is not None else layout

    def tokens(
        self, idx: torch.Tensor, targets: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        idx = split_to_layout(idx, self.mesh, self.layout, hidden=False)
        if targets is not None:
            targets = split_to_layout(targets, self.mesh, self.logits_layout, hidden=False)
        return idx, targets

    def forward(
        self, h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor | None
    ) -> torch.Tensor:
        if self._head:
            logits = self._head[0](h)
        else:
            logits = grid_tied_logits(h, weight, self.mesh, self.layout)
        if targets is None:
            return gather_from_layout(logits, self.mesh, self.logits_layout)
        return self.loss(at_least_fp32(logits), targets, self.mesh, self.logits_layout)


class GridLayers(TpLayers):
    """Sharding rules of the 2d, 2.5d and 3d modes (the mode is the mesh's)."""

    def __init__(self, mesh: ProcessMesh) -> None:
        super().__init__(mesh)
        if self.mode not in _KITS:
            raise ConfigError(f"GridLayers handles 2d, 2.5d and 3d meshes, got {self.mode!r}")
        self.kit = _KITS[self.mode]

    @property
    def head_parts(self) -> int:
        return self.mesh.size(self.kit.row_input.hidden_axis)

    def column(self, linear: nn.Linear) -> nn.Module:
        return self.kit.linear.from_linear(linear, self.mesh, layout=self.kit.stream)

    def row(self, linear: nn.Linear) -> nn.Module:
        return self.kit.linear.from_linear(linear, self.mesh, layout=self.kit.row_input)

    def kv(self, linear: nn.Linear, num_heads: int, num_kv_heads: int) -> nn.Module:
        what = f"{self.mode} key/value projection"
        share = kv_sharing(num_heads, num_kv_heads, self.head_parts, what)
        layer = self.column(linear)
        if share is None:
            return layer
        axis = self.kit.row_input.hidden_axis
        index = self.mesh.coord(axis) // share
        width = linear.out_features // num_kv_heads
        return GatheredKV(layer, self.mesh, axis, index=index, head_width=width)

    def norm(self, norm: nn.Module) -> nn.Module:
        if not isinstance(norm, nn.LayerNorm):
            raise ConfigError(
                f"{self.mode} tensor parallelism has a LayerNorm but no {type(norm).__name__}; "
                "use norm='layernorm' or the 1d mode"
            )
        bias_free = norm.bias is None
        if bias_free:  # the grid LayerNorm always has a bias: give it a frozen zero one
            with_bias = nn.LayerNorm(norm.normalized_shape, eps=norm.eps, dtype=norm.weight.dtype)
            with torch.no_grad():
                with_bias.weight.copy_(norm.weight)
            norm = with_bias
        layer = self.kit.norm.from_layernorm(norm, self.mesh, layout=self.kit.stream)
        if bias_free:
            layer.bias.requires_grad_(False)
        return layer

    def token_embedding(self, emb: nn.Embedding, *, positions_follow: bool) -> nn.Module:
        return self.kit.embedding.from_embedding(emb, self.mesh, layout=self.kit.stream)

    def position_embedding(self, emb: nn.Embedding) -> nn.Module:
        return self.kit.embedding.from_embedding(emb, self.mesh, layout=self.kit.stream)

    def output_head(self, linear: nn.Linear) -> nn.Module:
        return self.kit.classifier.from_linear(linear, self.mesh, layout=self.kit.stream)

    def io(self, *, head: nn.Module | None, positions_follow: bool) -> LMIO:
        return GridIO(self.mesh, self.kit.stream, self.kit.loss, head)
