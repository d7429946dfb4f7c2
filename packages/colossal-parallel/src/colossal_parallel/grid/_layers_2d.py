"""The 2D (SUMMA, ``q x q``) layers: every activation has layout ``LAYOUT_2D``.

A block ``(b, ..., h / q)`` on grid rank ``(i, j)`` is batch chunk ``i`` of ``q`` and hidden block
``j`` of ``q`` ([Note: SUMMA blocks], [Note: activation layout]).
"""

from __future__ import annotations

import torch

from .._mesh import ProcessMesh
from ._common import check_mode
from ._embedding import GridEmbedding, GridVocabEmbedding
from ._layout import TpLayout
from ._linear import GridHead
from ._loss import grid_cross_entropy
from ._norm import GridLayerNorm
from ._summa import COL_PEERS, ROW_PEERS, SummaLinear

__all__ = [
    "LAYOUT_2D",
    "Classifier2D",
    "Embedding2D",
    "LayerNorm2D",
    "Linear2D",
    "VocabParallelEmbedding2D",
    "cross_entropy_2d",
]

LAYOUT_2D = TpLayout(row_axes=(COL_PEERS,), hidden_axis=ROW_PEERS)


class _Mode2D:
    MODE = "2d"
    LAYOUTS = (LAYOUT_2D,)


class Linear2D(_Mode2D, SummaLinear):
    """SUMMA Linear: weight in ``q x q`` blocks, bias in ``q*q`` chunks; ``from_linear`` shards."""


class Classifier2D(_Mode2D, GridHead, SummaLinear):
    """The LM head ``hidden -> vocab`` (no bias by default); logits come vocabulary-parallel."""


class LayerNorm2D(_Mode2D, GridLayerNorm):
    """LayerNorm over hidden blocks split along ``tp_row``; affine chunks gathered along ``tp_col``."""


class Embedding2D(_Mode2D, GridEmbedding):
    """Embedding with the whole vocabulary; columns split over the ``q*q`` ranks."""


class VocabParallelEmbedding2D(_Mode2D, GridVocabEmbedding):
    """Embedding with vocabulary block ``i`` and hidden block ``j`` on rank ``(i, j)``."""


def cross_entropy_2d(
    logits: torch.Tensor, targets: torch.Tensor, mesh: ProcessMesh
) -> torch.Tensor:
    """Mean cross-entropy of vocabulary-parallel 2D logits (e.g. from ``Classifier2D``)."""
    check_mode(mesh, "2d", "cross_entropy_2d")
    return grid_cross_entropy(logits, targets, mesh, LAYOUT_2D)
