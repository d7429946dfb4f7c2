"""The sharded checkpoint format that Gemini and ZeRO-1/2 both write and read (either loads the
other's): its layout, the index check, and the reader (``_layout``, ``_index``, ``_reader``). The
building blocks other layouts write and read with are public here: the index file's name and
digests, the streamed safetensors header, Gemini's per-parameter shard runs and its full state
stream; ``save_sharded``/``load_sharded`` and the ZeRO pair stay in ``colossal_zero``."""

from .._safetensors_stream import TensorSpec, safetensors_header, tensor_bytes
from ..gemini._shards import GeminiShard, finish_gemini_load, gemini_shards
from ..gemini._stream_state import iter_full_state
from ._layout import INDEX_FILE, file_digest

__all__ = [
    "INDEX_FILE",
    "GeminiShard",
    "TensorSpec",
    "file_digest",
    "finish_gemini_load",
    "gemini_shards",
    "iter_full_state",
    "safetensors_header",
    "tensor_bytes",
]
