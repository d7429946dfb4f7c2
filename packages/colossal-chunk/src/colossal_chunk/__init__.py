"""colossal-chunk: Gemini chunks that move between accelerator, host and disk under a byte budget."""

from . import policies
from ._accounting import ManagerStats
from ._chunk import Chunk, PendingReduce
from ._config import ChunkConfig
from ._group import ChunkGroup, ChunkKind, GradPhase, Lifecycle
from ._hooks import ManagerHooks
from ._host_memory import host_empty, map_large_host_blocks, trim_host_heap
from ._manager import ChunkManager
from ._order import OrderStats
from ._search import pack, search_chunk_size
from ._tier import UNLIMITED
from ._updates import ShardUpdate
from .disk._read_ahead import window_bytes
from .disk._store import check_disk_dir
from .policies._auto import AutoPolicy
from .policies._static import StaticPolicy

__version__ = "0.1.0"
__all__ = [
    "UNLIMITED",
    "AutoPolicy",
    "Chunk",
    "ChunkConfig",
    "ChunkGroup",
    "ChunkKind",
    "ChunkManager",
    "GradPhase",
    "Lifecycle",
    "ManagerHooks",
    "ManagerStats",
    "OrderStats",
    "PendingReduce",
    "ShardUpdate",
    "StaticPolicy",
    "check_disk_dir",
    "host_empty",
    "map_large_host_blocks",
    "pack",
    "policies",
    "search_chunk_size",
    "trim_host_heap",
    "window_bytes",
]
