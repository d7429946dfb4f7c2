"""colossal-chunk: Gemini chunks that move between accelerator, host and disk under a byte budget."""

from ._accounting import ManagerStats, MoveStats, TierStats
from ._chunk import Chunk, PendingReduce, TensorRecord
from ._config import ChunkConfig
from ._host_memory import host_empty, map_large_host_blocks, trim_host_heap
from ._manager import ChunkManager
from ._order import OrderStats, module_order, trace_order
from ._search import ChunkSizeResult, pack, search_chunk_size
from ._tier import UNLIMITED, Tier
from .disk._read_ahead import ReadAheadWindow
from .disk._store import DiskIOStats, DiskStore, ReadRecord, check_disk_dir
from .policies._auto import AutoPolicy
from .policies._base import ChunkSummary, LruPolicy, PolicyContext, SimpleChunkInfo
from .policies._simulate import SimResult, simulate, simulate_policy
from .policies._static import StaticPolicy

__version__ = "0.1.0"
__all__ = [
    "UNLIMITED",
    "AutoPolicy",
    "Chunk",
    "ChunkConfig",
    "ChunkManager",
    "ChunkSizeResult",
    "ChunkSummary",
    "DiskIOStats",
    "DiskStore",
    "LruPolicy",
    "ManagerStats",
    "MoveStats",
    "OrderStats",
    "PendingReduce",
    "PolicyContext",
    "ReadAheadWindow",
    "ReadRecord",
    "SimResult",
    "SimpleChunkInfo",
    "StaticPolicy",
    "TensorRecord",
    "Tier",
    "TierStats",
    "check_disk_dir",
    "host_empty",
    "map_large_host_blocks",
    "module_order",
    "pack",
    "search_chunk_size",
    "simulate",
    "simulate_policy",
    "trace_order",
    "trim_host_heap",
]
