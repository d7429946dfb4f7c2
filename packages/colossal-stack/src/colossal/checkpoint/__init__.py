"""Checkpoints on disk, apart from the plugins that write them: publishing directories
atomically and finding the newest complete one (``_publish``), whole-model files (``_whole``),
the layout-independent sharded format and its readers (``_layout*``), streamed safetensors
shards (``_shard_writer``) and the consolidated export (``_export``).

``colossal.booster`` re-exports the names users call."""

from ._export import export_checkpoint
from ._layout import iter_full_tensors, read_layout_index
from ._layout_load import load_layout_checkpoint
from ._publish import explain_no_checkpoint, find_checkpoint, latest_checkpoint
from ._shard_writer import HF_INDEX, ShardedSafetensorsWriter, load_sharded_safetensors

__all__ = [
    "HF_INDEX",
    "ShardedSafetensorsWriter",
    "explain_no_checkpoint",
    "export_checkpoint",
    "find_checkpoint",
    "iter_full_tensors",
    "latest_checkpoint",
    "load_layout_checkpoint",
    "load_sharded_safetensors",
    "read_layout_index",
]
