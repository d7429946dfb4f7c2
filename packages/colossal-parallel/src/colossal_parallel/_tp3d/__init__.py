"""3D tensor parallelism (a ``q x q x q`` cube)."""

from ._layers import (
    LAYOUT_3D,
    LAYOUT_3D_T,
    Classifier3D,
    Embedding3D,
    LayerNorm3D,
    Linear3D,
    VocabParallelEmbedding3D,
    cross_entropy_3d,
)

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
