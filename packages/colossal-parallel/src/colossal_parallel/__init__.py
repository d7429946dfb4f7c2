"""colossal-parallel: process meshes, torchrun launch, counted collectives and tensor parallelism."""

from ._autograd import (
    copy_to_axis,
    gather_along,
    local_chunk,
    reduce_from_axis,
    reduce_scatter_along,
    split_along,
)
from ._axial import PendingSwitch, switch_shard_dim, switch_shard_dim_async
from ._comm import CountedComm
from ._config import TP_MODES, MeshConfig, TpMode, divide
from ._counter import COMM_OPS, CommCounter, CommStat
from ._grads import all_reduce_grads
from ._launch import LaunchInfo, launch_from_torch, seed_everything
from ._long_seq._layout import SEQ_LAYOUTS, SeqLayout, check_sequence, sequence_positions
from ._long_seq._ring import ring_attention, ring_attention_comm_bytes
from ._long_seq._ulysses import all_to_all_along, ulysses_attention, ulysses_comm_bytes
from ._mesh import ProcessMesh
from ._p2p import exchange
from ._pipeline._cost import pipeline_p2p_bytes
from ._pipeline._forward import run_pipeline_forward
from ._pipeline._partition import parameter_costs, partition_layers, stage_rank
from ._pipeline._runtime import PipelineResult, run_pipeline
from ._pipeline._schedule import (
    SCHEDULES,
    Action,
    PipelineSchedule,
    ideal_idle_fraction,
    idle_fractions,
    simulate,
)
from ._tp1d._cost import block_comm_bytes_1d
from ._tp1d._cross_entropy import (
    VocabParallelCrossEntropy,
    VocabParallelLMHead,
    vocab_parallel_cross_entropy,
)
from ._tp1d._embedding import ParallelEmbedding, VocabParallelEmbedding
from ._tp1d._linear import ColumnParallelLinear, RowParallelLinear
from ._tp1d._norm import LayerNorm1D
from ._tp1d._sequence import gather_sequence, split_sequence
from ._tp2d._layers import (
    LAYOUT_2D,
    Classifier2D,
    Embedding2D,
    LayerNorm2D,
    Linear2D,
    VocabParallelEmbedding2D,
    cross_entropy_2d,
)
from ._tp2p5d._layers import (
    LAYOUT_2P5D,
    Classifier2p5D,
    Embedding2p5D,
    LayerNorm2p5D,
    Linear2p5D,
    VocabParallelEmbedding2p5D,
    cross_entropy_2p5d,
)
from ._tp3d._layers import (
    LAYOUT_3D,
    LAYOUT_3D_T,
    Classifier3D,
    Embedding3D,
    LayerNorm3D,
    Linear3D,
    VocabParallelEmbedding3D,
    cross_entropy_3d,
)
from ._tpnd._cost import (
    CommCost,
    cross_entropy_comm_bytes,
    embedding_comm_bytes,
    layernorm_comm_bytes,
    linear_comm_bytes,
    vocab_embedding_comm_bytes,
)
from ._tpnd._layout import TpLayout, gather_from_layout, split_to_layout

__version__ = "0.1.0"

__all__ = [
    "COMM_OPS",
    "LAYOUT_2D",
    "LAYOUT_2P5D",
    "LAYOUT_3D",
    "LAYOUT_3D_T",
    "SCHEDULES",
    "SEQ_LAYOUTS",
    "TP_MODES",
    "Action",
    "Classifier2D",
    "Classifier2p5D",
    "Classifier3D",
    "ColumnParallelLinear",
    "CommCost",
    "CommCounter",
    "CommStat",
    "CountedComm",
    "Embedding2D",
    "Embedding2p5D",
    "Embedding3D",
    "LaunchInfo",
    "LayerNorm1D",
    "LayerNorm2D",
    "LayerNorm2p5D",
    "LayerNorm3D",
    "Linear2D",
    "Linear2p5D",
    "Linear3D",
    "MeshConfig",
    "ParallelEmbedding",
    "PendingSwitch",
    "PipelineResult",
    "PipelineSchedule",
    "ProcessMesh",
    "RowParallelLinear",
    "SeqLayout",
    "TpLayout",
    "TpMode",
    "VocabParallelCrossEntropy",
    "VocabParallelEmbedding",
    "VocabParallelEmbedding2D",
    "VocabParallelEmbedding2p5D",
    "VocabParallelEmbedding3D",
    "VocabParallelLMHead",
    "all_reduce_grads",
    "all_to_all_along",
    "block_comm_bytes_1d",
    "check_sequence",
    "copy_to_axis",
    "cross_entropy_2d",
    "cross_entropy_2p5d",
    "cross_entropy_3d",
    "cross_entropy_comm_bytes",
    "divide",
    "embedding_comm_bytes",
    "exchange",
    "gather_along",
    "gather_from_layout",
    "gather_sequence",
    "ideal_idle_fraction",
    "idle_fractions",
    "launch_from_torch",
    "layernorm_comm_bytes",
    "linear_comm_bytes",
    "local_chunk",
    "parameter_costs",
    "partition_layers",
    "pipeline_p2p_bytes",
    "reduce_from_axis",
    "reduce_scatter_along",
    "ring_attention",
    "ring_attention_comm_bytes",
    "run_pipeline",
    "run_pipeline_forward",
    "seed_everything",
    "sequence_positions",
    "simulate",
    "split_along",
    "split_sequence",
    "split_to_layout",
    "stage_rank",
    "switch_shard_dim",
    "switch_shard_dim_async",
    "ulysses_attention",
    "ulysses_comm_bytes",
    "vocab_embedding_comm_bytes",
    "vocab_parallel_cross_entropy",
]
