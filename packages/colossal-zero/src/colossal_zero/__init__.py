"""colossal-zero: Gemini (ZeRO-3 over chunks), hybrid CPU/accelerator Adam, mixed precision and
sharded checkpoints.

    model = apply_gemini(model, GeminiConfig(precision="bf16", accelerator_bytes=512 << 20))
    optimizer = GeminiOptimizer(model, model.parameters(), lr=3e-4)
    optimizer.backward(model(x, y)); optimizer.step(); optimizer.zero_grad()
"""

from ._adam import AdamHyper, HybridAdam, adamw_update, global_grad_norm
from ._checkpoint import INDEX_FILE, consolidate, file_digest, load_sharded, save_sharded
from ._config import PLACEMENTS, GeminiConfig
from ._lazy import LazyInit
from ._mesh_norm import GradNorm, mesh_grad_norm
from ._module import GeminiModule, apply_gemini
from ._optimizer import GeminiOptimizer
from ._precision import PRECISIONS, Precision
from ._safetensors_stream import SafetensorsStream, TensorSpec, safetensors_header, tensor_bytes
from ._scaler import DynamicLossScaler, LossScalerConfig
from ._stream_state import iter_full_state
from ._zero_checkpoint import load_zero_sharded, save_zero_sharded
from ._zero_config import ZERO_STAGES, ZeroConfig
from ._zero_formula import model_state_bytes_per_param, zero3_device_bytes
from ._zero_optimizer import LowLevelZeroOptimizer

__version__ = "0.1.0"
__all__ = [
    "INDEX_FILE",
    "PLACEMENTS",
    "PRECISIONS",
    "ZERO_STAGES",
    "AdamHyper",
    "DynamicLossScaler",
    "GeminiConfig",
    "GeminiModule",
    "GeminiOptimizer",
    "GradNorm",
    "HybridAdam",
    "LazyInit",
    "LossScalerConfig",
    "LowLevelZeroOptimizer",
    "Precision",
    "SafetensorsStream",
    "TensorSpec",
    "ZeroConfig",
    "adamw_update",
    "apply_gemini",
    "consolidate",
    "file_digest",
    "global_grad_norm",
    "iter_full_state",
    "load_sharded",
    "load_zero_sharded",
    "mesh_grad_norm",
    "model_state_bytes_per_param",
    "safetensors_header",
    "save_sharded",
    "save_zero_sharded",
    "tensor_bytes",
    "zero3_device_bytes",
]
