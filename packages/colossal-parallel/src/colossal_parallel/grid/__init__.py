"""Multi-dimensional tensor parallelism on a device grid: 2D (SUMMA on a ``q x q`` grid), 2.5D
(Tesseract: ``d`` SUMMA layers of ``q x q``) and 3D (the cube algorithm on ``q x q x q``).

Each mode differs only in its Linear (``_summa.py`` for 2D/2.5D, ``_cube.py`` for 3D) and in
which mesh axes split an activation (a ``TpLayout``); LayerNorm, the embeddings, the
cross-entropy and what the two Linears share (``GridLinear``) are written once against a
``TpLayout`` (``_layout.py``, ``_linear.py``, ``_norm.py``, ``_embedding.py``, ``_loss.py``).
The layers of each mode: ``_layers_2d.py``, ``_layers_2p5d.py``, ``_layers_3d.py``.
"""

from ._cost import (
    CommCost,
    cross_entropy_comm_bytes,
    embedding_comm_bytes,
    layernorm_comm_bytes,
    linear_comm_bytes,
    vocab_embedding_comm_bytes,
)
from ._layers_2d import (
    LAYOUT_2D,
    Classifier2D,
    Embedding2D,
    LayerNorm2D,
    Linear2D,
    VocabParallelEmbedding2D,
    cross_entropy_2d,
)
from ._layers_2p5d import (
    LAYOUT_2P5D,
    Classifier2p5D,
    Embedding2p5D,
    LayerNorm2p5D,
    Linear2p5D,
    VocabParallelEmbedding2p5D,
    cross_entropy_2p5d,
)
from ._layers_3d import (
    LAYOUT_3D,
    LAYOUT_3D_T,
    Classifier3D,
    Embedding3D,
    LayerNorm3D,
    Linear3D,
    VocabParallelEmbedding3D,
    cross_entropy_3d,
)
from ._layout import TpLayout, gather_from_layout, split_to_layout

__all__ = [
    "LAYOUT_2D",
    "LAYOUT_2P5D",
    "LAYOUT_3D",
    "LAYOUT_3D_T",
    "Classifier2D",
    "Classifier2p5D",
    "Classifier3D",
    "CommCost",
    "Embedding2D",
    "Embedding2p5D",
    "Embedding3D",
    "LayerNorm2D",
    "LayerNorm2p5D",
    "LayerNorm3D",
    "Linear2D",
    "Linear2p5D",
    "Linear3D",
    "TpLayout",
    "VocabParallelEmbedding2D",
    "VocabParallelEmbedding2p5D",
    "VocabParallelEmbedding3D",
    "cross_entropy_2d",
    "cross_entropy_2p5d",
    "cross_entropy_3d",
    "cross_entropy_comm_bytes",
    "embedding_comm_bytes",
    "gather_from_layout",
    "layernorm_comm_bytes",
    "linear_comm_bytes",
    "split_to_layout",
    "vocab_embedding_comm_bytes",
]
