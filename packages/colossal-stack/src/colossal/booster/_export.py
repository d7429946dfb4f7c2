"""``export_checkpoint``: a layout-independent checkpoint (any layout) as one consolidated fp32
state dict in safetensors shards of bounded size, under our names or Hugging Face's.

Export reads the checkpoint, not a live job: it runs in one process without a mesh or GPU,
whatever layout wrote the checkpoint. Under our names each unsharded tensor is assembled from
its blocks, written and dropped in turn ([Note: streamed export]), so host memory holds one
tensor plus one shard. Hugging Face names go through the model's state-dict adapter
(``GPT2StateDictAdapter``, ``LlamaStateDictAdapter``), which converts a whole state dict: that
path holds the consolidated model once in host memory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from colossal_contracts import CheckpointError, ConfigError
from colossal_models import GPT2StateDictAdapter, GPTConfig, LlamaStateDictAdapter, PaLMConfig

from ._gemini import parse_bytes
from ._hybrid_checkpoint import LAYOUT_INDEX, iter_full_tensors, read_layout_index
from ._publish import latest_checkpoint
from ._shard_writer import ShardedSafetensorsWriter

__all__ = ["export_checkpoint"]


def _adapter(model: dict[str, Any] | None, path: Path) -> Any:
    if not isinstance(model, dict) or not isinstance(model.get("config"), dict):
        raise CheckpointError(
            f"{path / LAYOUT_INDEX} does not say which model it holds; Hugging Face names need a "
            "GPT or PaLM checkpoint (export with hf=False for our names)"
        )
    kind, cfg = model.get("class"), model["config"]
    if kind == "GPT":
        return GPT2StateDictAdapter(GPTConfig(**cfg))
    if kind == "PaLM":
        return LlamaStateDictAdapter(PaLMConfig(**cfg))
    raise ConfigError(f"no Hugging Face adapter for a {kind} checkpoint; export with hf=False")


def export_checkpoint(
    checkpoint: Path,
    out: Path,
    *,
    hf: bool = False,
    max_shard_bytes: int | str = "2GiB",
) -> Path:
    """Write the fp32 weights of ``checkpoint`` (a ``step-N`` directory, or a run's checkpoint
    root: its ``latest``) into ``out`` as ``model-0000i-of-0000N.safetensors`` and
    ``model.safetensors.index.json``; returns the index path. ``hf``: Hugging Face names and a
    ``config.json`` (``GPT2LMHeadModel`` / ``LlamaForCausalLM.from_pretrained(out)`` loads it;
    tied heads are left to ``tie_word_embeddings``). One process, no collective."""
    src = Path(checkpoint)
    if not (src / LAYOUT_INDEX).is_file():
        src = latest_checkpoint(src)
    index = read_layout_index(src)
    limit = parse_bytes(max_shard_bytes)
    if limit is None:
        raise ConfigError("max_shard_bytes must be a size such as '2GiB' or a number of bytes")
    out = Path(out)
    with ShardedSafetensorsWriter(out, max_shard_bytes=limit) as writer:
        if not hf:
            for name, tensor in iter_full_tensors(src):
                writer.add(name, tensor)
        else:
            adapter = _adapter(index.get("model"), src)
            state = adapter.to_hf(dict(iter_full_tensors(src)))
            seen: set[int] = set()  # ids are stable: ``state`` holds every tensor meanwhile
            for name, tensor in state.items():
                if id(tensor) in seen:
                    continue  # a tied alias (lm_head of a tied embedding)
                seen.add(id(tensor))
                writer.add(name, tensor)
            adapter.config_to_hf().save_pretrained(str(out))
    return out / "model.safetensors.index.json"
