"""Where each tensor of a saved Hugging Face model lives, so it can be read alone.

[Note: HF weights tensor by tensor] A model built lazily (on the meta device, colossal-zero's
[Note: lazy init]) replays each tensor's initialisation when it is materialized. For a folder of
saved weights the values must come from the files instead: ``hf_weight_sources`` gives, for every
parameter and persistent buffer of the model, a function that reads that one tensor from its
safetensors file (``safe_open`` maps the file; only the tensor's bytes are read), so materializing
chunk by chunk holds one tensor of the checkpoint at a time instead of the whole state dict that
``from_pretrained`` builds. It answers None where it cannot promise eager loading's values: pickle
weights (``pytorch_model.bin``, read whole), or files whose names do not cover every parameter
(loading would initialise the missing ones, or rename keys the way only ``from_pretrained`` knows).
A file the header of which cannot be read is a ``ConfigError`` naming it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from torch import nn

from colossal_contracts import ConfigError

__all__ = ["hf_weight_sources", "index_files", "unreadable_weights"]

Load = Callable[[], torch.Tensor]


def index_files(folder: Path, name: str) -> list[str] | None:
    """The files the sharded index ``folder/name`` maps tensors to (sorted, as written); None
    without that index; ``ConfigError`` when it has no readable ``weight_map``."""
    index = folder / name
    if not index.is_file():
        return None
    try:
        return sorted(set(map(str, json.loads(index.read_text())["weight_map"].values())))
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError):
        raise ConfigError(f"hf:{folder}: {name} has no readable 'weight_map'") from None


def unreadable_weights(where: object, exc: Exception) -> ConfigError:
    """The one-line refusal of saved weights that cannot be loaded (truncated safetensors,
    refused pickles, torn shards), naming ``where`` and the library's own error."""
    cause = " ".join(str(exc).split())[:200]
    return ConfigError(
        f"hf:{where}: cannot load the saved weights ({type(exc).__name__}: {cause}); "
        "save them again with save_pretrained (safetensors)"
    )


def _safetensors_files(folder: Path) -> list[Path] | None:
    """The safetensors files of ``folder`` (one, or the shards its index names); None when the
    weights are pickles; [] when there are none."""
    shards = index_files(folder, "model.safetensors.index.json")
    if shards is not None:
        return [folder / n for n in shards]
    if (folder / "model.safetensors").is_file():
        return [folder / "model.safetensors"]
    if any((folder / n).is_file() for n in ("pytorch_model.bin", "pytorch_model.bin.index.json")):
        return None
    return []


def _keys(file: Path) -> list[str]:
    from safetensors import safe_open

    try:
        with safe_open(str(file), framework="pt") as f:
            return list(f.keys())
    except Exception as exc:  # a truncated or torn file: safetensors' own error, on one line
        raise unreadable_weights(file, exc) from exc


def _reader(file: Path, key: str) -> Load:
    def load() -> torch.Tensor:
        from safetensors import safe_open

        with safe_open(str(file), framework="pt") as f:
            return f.get_tensor(key)

    return load


def _named_tensors(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Each parameter once (tied ones under their first name), then the persistent buffers."""
    yield from model.named_parameters()
    persistent = set(model.state_dict(keep_vars=True))
    for name, b in model.named_buffers():
        if name in persistent:
            yield name, b


def hf_weight_sources(folder: str | Path, model: nn.Module) -> dict[str, Load] | None:
    """For the Hugging Face ``model`` (the ``*ForCausalLM`` itself, any device) whose weights
    ``folder`` holds: name -> a function reading that tensor from its file (the saved dtype), for
    every parameter and persistent buffer the files hold; see [Note: HF weights tensor by tensor].
    {} when ``folder`` holds no weights; None when they cannot be read tensor by tensor, or do not
    name every parameter."""
    folder = Path(folder)
    files = _safetensors_files(folder)
    if files is None:
        return None
    if not files:  # no weights: Hugging Face's initialisation, which lazy init replays
        return {}
    where = {key: file for file in files for key in _keys(file)}
    sources: dict[str, Load] = {}
    for name, t in _named_tensors(model):
        if name in where:
            sources[name] = _reader(where[name], name)
        elif isinstance(t, nn.Parameter):
            return None
    return sources
