"""2D tensor parallelism (SUMMA on a ``q x q`` grid)."""

from ._layers import (
    LAYOUT_2D,
    Classifier2D,
    Embedding2D,
    LayerNorm2D,
    Linear2D,
    VocabParallelEmbedding2D,
    cross_entropy_2d,
)

__all__ = [
    "LAYOUT_2D",
    "Classifier2D",
    "Embedding2D",
    "LayerNorm2D",
    "Linear2D",
    "VocabParallelEmbedding2D",
    "cross_entropy_2d",
]
