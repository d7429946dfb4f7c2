"""1D (Megatron) tensor parallelism over the mesh's ``tp`` axis: column- and row-parallel
Linears, vocabulary-parallel embedding, head and cross-entropy, LayerNorm, and Megatron's sequence
parallelism (``split_sequence`` / ``gather_sequence``)."""

from ._cost import block_comm_bytes_1d
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
    "block_comm_bytes_1d",
    "gather_sequence",
    "split_sequence",
    "vocab_parallel_cross_entropy",
]
