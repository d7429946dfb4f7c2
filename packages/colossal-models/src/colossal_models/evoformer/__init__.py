"""AlphaFold 2's Evoformer (FastFold): config and presets, model, dynamic axial parallelism
plan, chunk-size choice for inference, OpenFold-style state-dict names."""

from .chunking import chunk_bytes_per_row, chunk_size_for_budget
from .config import EVOFORMER_PRESETS, EvoformerConfig
from .model import Evoformer, EvoformerBlock, LocalAxes, check_chunk_size
from .parallelize import DapAxes, dap_comm_bytes, parallelize_evoformer

__all__ = [
    "EVOFORMER_PRESETS",
    "DapAxes",
    "Evoformer",
    "EvoformerBlock",
    "EvoformerConfig",
    "LocalAxes",
    "check_chunk_size",
    "chunk_bytes_per_row",
    "chunk_size_for_budget",
    "dap_comm_bytes",
    "parallelize_evoformer",
]
