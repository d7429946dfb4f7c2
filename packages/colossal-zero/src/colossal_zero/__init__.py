"""colossal-zero: Gemini (ZeRO-3 over chunks), hybrid CPU/accelerator Adam, mixed precision and
sharded checkpoints.

    model = apply_gemini(model, GeminiConfig(precision="bf16", accelerator_bytes=512 << 20))
    optimizer = GeminiOptimizer(model, model.parameters(), lr=3e-4)
    optimizer.backward(model(x, y)); optimizer.step(); optimizer.zero_grad()
"""

from colossal_chunk import check_disk_dir  # the disk tier's check, before GeminiConfig's use

from . import checkpoint
from ._lazy import LazyInit
from .checkpoint._reader import consolidate
from .gemini._checkpoint import load_sharded, save_sharded
from .gemini._config import GeminiConfig
from .gemini._module import GeminiModule, apply_gemini
from .gemini._optimizer import GeminiOptimizer
from .gemini._setup import (
    chunk_bytes_per_param,
    gemini_chunk_numel,
    gemini_num_chunks,
    read_ahead_bytes,
)
from .low_level._checkpoint import load_zero_sharded, save_zero_sharded
from .low_level._config import ZeroConfig
from .low_level._formula import model_state_bytes_per_param, zero3_device_bytes
from .low_level._optimizer import LowLevelZeroOptimizer
from .optim._adam import AdamHyper, HybridAdam, adamw_update, global_grad_norm
from .optim._cpu_matmul import MATMUL_ENV, Fp32Matmul, cpu_has_fast_matmul
from .optim._from_torch import adam_arguments
from .optim._mesh_norm import mesh_grad_norm
from .optim._precision import PRECISIONS, Precision
from .optim._scaler import LossScalerConfig

__version__ = "0.1.0"
__all__ = [
    "MATMUL_ENV",
    "PRECISIONS",
    "AdamHyper",
    "Fp32Matmul",
    "GeminiConfig",
    "GeminiModule",
    "GeminiOptimizer",
    "HybridAdam",
    "LazyInit",
    "LossScalerConfig",
    "LowLevelZeroOptimizer",
    "Precision",
    "ZeroConfig",
    "adam_arguments",
    "adamw_update",
    "apply_gemini",
    "check_disk_dir",
    "checkpoint",
    "chunk_bytes_per_param",
    "consolidate",
    "cpu_has_fast_matmul",
    "gemini_chunk_numel",
    "gemini_num_chunks",
    "global_grad_norm",
    "load_sharded",
    "load_zero_sharded",
    "mesh_grad_norm",
    "model_state_bytes_per_param",
    "read_ahead_bytes",
    "save_sharded",
    "save_zero_sharded",
    "zero3_device_bytes",
]
