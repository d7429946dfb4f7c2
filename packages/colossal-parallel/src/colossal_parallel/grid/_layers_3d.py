"""The 3D (``q x q x q`` cube) layers.

Activations have layout ``LAYOUT_3D`` (rows split along ``tp_wt, tp_in``, hidden along
``tp_out``) or its transpose ``LAYOUT_3D_T``; each Linear swaps them ([Note: cube blocks]). The
other layers keep the layout they are given (``layout=`` in their constructors).
"""

from __future__ import annotations

import torch

from .._mesh import ProcessMesh
from ._common import check_mode
from ._cube import LAYOUT_3D, LAYOUT_3D_T, CubeLinear
from ._embedding import GridEmbedding, GridVocabEmbedding
from ._layout import TpLayout
from ._linear import GridHead
from ._loss import grid_cross_entropy
from ._norm import GridLayerNorm

__all__ = [
    "LAYOUT_3D",
    "LAYOUT_3D_T",
    "Classifier3D",
    "Embedding3D",
    "LayerNorm3D",
    "Linear3D",
    "VocabParallelEmbedding3D",
    "cross_entropy_3d",
]


class _Mode3D:
    MODE = "3d"
    LAYOUTS = (LAYOUT_3D, LAYOUT_3D_T)


class Linear3D(_Mode3D, CubeLinear):
    """Cube Linear: every weight element stored once over the ``q**3`` ranks."""


class Classifier3D(_Mode3D, GridHead, CubeLinear):
    """The LM head ``hidden -> vocab`` (no bias by default); logits come in the swapped layout."""


class LayerNorm3D(_Mode3D, GridLayerNorm):
    """LayerNorm over hidden blocks split along the layout's hidden axis."""


class Embedding3D(_Mode3D, GridEmbedding):
    """Embedding with the whole vocabulary; columns split over the cube."""


class VocabParallelEmbedding3D(_Mode3D, GridVocabEmbedding):
    """Embedding split by vocabulary along the layout's inner row axis and by hidden block."""


def cross_entropy_3d(
    logits: torch.Tensor,
    targets: torch.Tensor,
    mesh: ProcessMesh,
    *,
    layout: TpLayout = LAYOUT_3D_T,
) -> torch.Tensor:
    """Mean cross-entropy of vocabulary-parallel 3D logits; ``layout`` is the logits' layout
    (``Classifier3D(layout=LAYOUT_3D).out_layout == LAYOUT_3D_T``, the default)."""
    check_mode(mesh, "3d", "cross_entropy_3d")
    return grid_cross_entropy(logits, targets, mesh, layout)
