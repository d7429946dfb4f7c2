"""A sharded plugin's consolidated model on disk: Gemini's streamed export into safetensors
shards with a Hugging Face index (``export_gemini``) and the ZeRO plugin's one-file full model
(``write_full_model``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors.torch import save_file

from colossal_models.sharding import ShardMap
from colossal_parallel import ProcessMesh
from colossal_zero import GeminiModule
from colossal_zero.checkpoint import iter_full_state

from ..checkpoint._shard_writer import ShardedSafetensorsWriter
from ._gemini_tp import tp_shard_maps, tp_stream_state

__all__ = ["FULL_MODEL_FILE", "export_gemini", "write_full_model"]

FULL_MODEL_FILE = "model.safetensors"


def export_gemini(
    model: GeminiModule,
    path: Path,
    *,
    max_shard_bytes: int,
    mesh: ProcessMesh | None = None,
    maps: list[dict[str, ShardMap]] | None = None,
) -> None:
    """Rank 0 writes ``model``'s consolidated fp32 state into ``path`` as safetensors shards of
    at most ``max_shard_bytes`` with a Hugging Face index. Collective over the model's dp group
    (and ``mesh``'s tp ranks). It streams: one chunk is gathered at a time and its tensors are
    written before the next (``iter_full_state``), so no rank holds the model; with tp each
    tensor is first assembled over tp on rank 0 (``tp_stream_state``; ``maps``: the plugin's
    ``tp_shard_maps``, computed here when not given)."""
    tensors: Any = iter_full_state(model)  # collective over dp: every rank iterates
    if mesh is not None:
        maps = maps if maps is not None else tp_shard_maps(model.module, mesh)
        tensors = tp_stream_state(model.module, tensors, mesh, maps)  # over tp, tensor by tensor
    if _rank() != 0:
        for _ in tensors:
            pass
        return
    with ShardedSafetensorsWriter(path, max_shard_bytes=max_shard_bytes) as writer:
        for name, tensor in tensors:
            writer.add(name, tensor)


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def write_full_model(full: dict[str, torch.Tensor], path: Path) -> None:
    """Rank 0 writes the consolidated ``full`` state into ``path / FULL_MODEL_FILE`` (one
    file: the ZeRO plugin's export)."""
    if _rank() == 0:
        save_file({k: v.contiguous() for k, v in _untie(full).items()}, str(path / FULL_MODEL_FILE))


def _untie(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """safetensors refuses shared storages: give every name its own tensor."""
    seen: set[int] = set()
    out = {}
    for k, v in state.items():
        ptr = v.untyped_storage().data_ptr()
        out[k] = v.clone() if ptr in seen else v
        seen.add(ptr)
    return out
