"""The 2.5D (Tesseract, ``d x q x q``) layers: every activation has layout ``LAYOUT_2P5D``.

Depth layer ``h = coord("tp_dep")`` is a 2D grid that runs SUMMA on its own batch slice: a block
``(b, ..., f / q)`` on rank ``(h, i, j)`` is batch chunk ``h*q + i`` of ``d*q`` and feature block
``j``. Weights are the ``q x q`` SUMMA blocks replicated on every depth layer; their gradients are
all-reduced along ``tp_dep`` in backward ([Note: SUMMA blocks], [Note: vector parameters]).
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
    "LAYOUT_2P5D",
    "Classifier2p5D",
    "Embedding2p5D",
    "LayerNorm2p5D",
    "Linear2p5D",
    "VocabParallelEmbedding2p5D",
    "cross_entropy_2p5d",
]

DEPTH = "tp_dep"
LAYOUT_2P5D = TpLayout(row_axes=(DEPTH, COL_PEERS), hidden_axis=ROW_PEERS)


class _Mode2p5D:
    MODE = "2.5d"
    LAYOUTS = (LAYOUT_2P5D,)


class Linear2p5D(_Mode2p5D, SummaLinear):
    """Tesseract Linear: SUMMA per depth layer, weight gradients all-reduced along ``tp_dep``."""


class Classifier2p5D(_Mode2p5D, GridHead, SummaLinear):
    """The LM head ``hidden -> vocab`` (no bias by default); logits come vocabulary-parallel."""


class LayerNorm2p5D(_Mode2p5D, GridLayerNorm):
    """LayerNorm over hidden blocks split along ``tp_row``."""


class Embedding2p5D(_Mode2p5D, GridEmbedding):
    """Embedding with the whole vocabulary; columns split over a depth layer's ``q*q`` ranks."""


class VocabParallelEmbedding2p5D(_Mode2p5D, GridVocabEmbedding):
    """Embedding with vocabulary block ``i``, hidden block ``j`` on ``(h, i, j)`` for every ``h``."""


def cross_entropy_2p5d(
    logits: torch.Tensor, targets: torch.Tensor, mesh: ProcessMesh
) -> torch.Tensor:
    """Mean cross-entropy of vocabulary-parallel 2.5D logits (e.g. from ``Classifier2p5D``)."""
    check_mode(mesh, "2.5d", "cross_entropy_2p5d")
    return grid_cross_entropy(logits, targets, mesh, LAYOUT_2P5D)
