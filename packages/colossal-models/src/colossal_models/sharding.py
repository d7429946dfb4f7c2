"""Where a tensor-parallel model's tensors live: each shard's pieces in the unsharded tensor
(``shard_map``, ``Box``/``Piece``), a model's plan in words (``describe_sharding``), the names parameters had before sharding
(``original_names``), and the
gathers back to full tensors (``gather_full_state_dict``, ``stream_full_state``)."""

from ._gather import all_shard_maps, gather_full_state_dict, gather_full_tensor, stream_full_state
from ._shard_map import Box, Piece, ShardMap, flat_range_boxes, shard_map
from ._sharding import describe_sharding
from ._tp._kv import original_names

__all__ = [
    "Box",
    "Piece",
    "ShardMap",
    "all_shard_maps",
    "describe_sharding",
    "flat_range_boxes",
    "gather_full_state_dict",
    "gather_full_tensor",
    "original_names",
    "shard_map",
    "stream_full_state",
]
