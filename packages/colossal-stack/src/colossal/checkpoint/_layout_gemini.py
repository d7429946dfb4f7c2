"""Gemini's shards in the layout-independent checkpoint ([Note: layout checkpoint]).

A Gemini chunk's shard on this rank holds, for each parameter in it, a run of the parameter's
flat elements ``[lo, hi)`` (fp32 masters, and the Adam moments in the parallel chunks of the same
layout), exactly what ZeRO-1/2's flat buffers hold; with tensor parallelism those elements are of
the rank's tp shard, placed in the unsharded tensor by its ``ShardMap``. So Gemini, with or without
tp, writes and reads the same blocks as the hybrid plugin, and a checkpoint of any layout
resumes under Gemini and the other way round. The runs themselves come from colossal-zero
(``gemini_shards``, ``finish_gemini_load``): the stack does not reach into Gemini's runtime.
"""

from __future__ import annotations

from colossal_models.sharding import ShardMap
from colossal_zero.checkpoint import finish_gemini_load, gemini_shards

__all__ = ["finish_gemini_load", "gemini_shards", "shard_map_of"]


def shard_map_of(maps: dict[str, ShardMap] | None, name: str, shape: tuple[int, ...]) -> ShardMap:
    """The tp shard map of ``name`` (whole when the model is not tensor-parallel)."""
    return maps[name] if maps is not None else ShardMap.whole(name, shape)
