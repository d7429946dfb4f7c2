"""2.5D tensor parallelism (Tesseract: SUMMA on each of ``d`` stacked ``q x q`` grids)."""

from ._layers import (
    LAYOUT_2P5D,
    Classifier2p5D,
    Embedding2p5D,
    LayerNorm2p5D,
    Linear2p5D,
    VocabParallelEmbedding2p5D,
    cross_entropy_2p5d,
)

__all__ = [
    "LAYOUT_2P5D",
    "Classifier2p5D",
    "Embedding2p5D",
    "LayerNorm2p5D",
    "Linear2p5D",
    "VocabParallelEmbedding2p5D",
    "cross_entropy_2p5d",
]
