"""1D (Megatron) tensor parallelism and sequence parallelism."""

from ._cross_entropy import (
    VocabParallelCrossEntropy,
    VocabParallelLMHead,
    vocab_parallel_cross_entropy,
)
from ._embedding import ParallelEmbedding, VocabParallelEmbedding
from ._linear import ColumnParallelLinear, RowParallelLinear
from ._norm import LayerNorm1D
from ._sequence import gather_sequence, split_sequence

__all__ = [
    "ColumnParallelLinear",
    "LayerNorm1D",
    "ParallelEmbedding",
    "RowParallelLinear",
    "VocabParallelCrossEntropy",
    "VocabParallelEmbedding",
    "VocabParallelLMHead",
    "gather_sequence",
    "split_sequence",
    "vocab_parallel_cross_entropy",
]
