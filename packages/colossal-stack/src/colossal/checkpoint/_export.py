"""``export_checkpoint``: a layout-independent checkpoint (any layout) as one consolidated fp32
state dict in safetensors shards of bounded size, under our names or Hugging Face's.

Export reads the checkpoint, not a live job: it runs in one process without a mesh or GPU,
whatever layout wrote the checkpoint. Under our names each unsharded tensor is assembled from
its blocks, written and dropped in turn ([Note: streamed export]), so host memory holds one
tensor plus one shard. Hugging Face names are ``colossal.export.export_hf``'s (any plugin's
checkpoint; the adapters convert a whole state dict, so that path holds the model once).
"""

from __future__ import annotations

from pathlib import Path

from colossal_contracts import ConfigError

from .._sizes import parse_bytes
from ._layout import LAYOUT_INDEX, iter_full_tensors, read_layout_index
from ._publish import latest_checkpoint
from ._shard_writer import HF_INDEX, ShardedSafetensorsWriter

__all__ = ["export_checkpoint"]


def export_checkpoint(
    checkpoint: Path,
    out: Path,
    *,
    hf: bool = False,
    max_shard_bytes: int | str = "2GiB",
) -> Path:
    """Write the fp32 weights of ``checkpoint`` (a ``step-N`` directory, or a run's checkpoint
    root: its ``latest``) into ``out`` as ``model-0000i-of-0000N.safetensors`` and
    ``model.safetensors.index.json``; returns the index path. ``hf``: a Hugging Face folder
    (``colossal.export.export_hf``: config.json, transformers' names, tied weights once).
    One process, no collective."""
    src = Path(checkpoint)
    if not (src / LAYOUT_INDEX).is_file():
        src = latest_checkpoint(src)
    read_layout_index(src)  # a layout checkpoint, or a CheckpointError saying it is not
    limit = parse_bytes(max_shard_bytes)
    if limit is None:
        raise ConfigError("max_shard_bytes must be a size such as '2GiB' or a number of bytes")
    if hf:  # one implementation of Hugging Face folders (import here: it imports booster)
        from ..export import export_hf

        return export_hf(src, out, max_shard_bytes=limit) / HF_INDEX
    with ShardedSafetensorsWriter(Path(out), max_shard_bytes=limit) as writer:
        for name, tensor in iter_full_tensors(src):
            writer.add(name, tensor)
    return Path(out) / HF_INDEX
