"""Loading the layout-independent checkpoint into any layout ([Note: layout checkpoint] in
``_layout``): each rank fills the blocks it holds, reading only the slices it needs."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from colossal_contracts import CheckpointError
from colossal_parallel import ProcessMesh
from colossal_zero import GeminiModule, GeminiOptimizer, LowLevelZeroOptimizer

from ._layout import _held, _regions, _scaler, _world
from ._layout_gemini import finish_gemini_load
from ._layout_legacy import checkpoint_index
from ._layout_read import KINDS, _fill, _Reader

__all__ = ["load_layout", "load_layout_checkpoint"]


@torch.no_grad()
def load_layout(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    mesh: ProcessMesh | None,
    directory: Path,
    *,
    rename: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Fill the blocks this rank holds from the checkpoint ``directory`` (any layout, any
    plugin's format: [Note: one reader] in ``_layout_legacy``); ZeRO's parameters are then
    all-gathered. Returns the index. A checkpoint without frozen values, or ``rename``, leaves
    a ``peft`` model's base as it is. ``CheckpointError`` when the model does not match or a
    file is missing or corrupt."""
    index = checkpoint_index(directory)
    frozen = not (rename or index.get("frozen_omitted"))
    held = _held(model, optimizer, mesh, fresh=True, frozen=frozen, rename=rename)
    names = [{h.smap.name for h in held}]
    if _world()[1] > 1:
        names = [set()] * _world()[1]
        dist.all_gather_object(names, {h.smap.name for h in held})
    extra = sorted(set(index["params"]) - set().union(*names))
    if extra:
        raise CheckpointError(
            f"checkpoint {directory} holds parameters this model lacks ({extra[:3]}, "
            f"{len(extra)} in all); was it saved from another model or preset?"
        )
    with ExitStack() as stack:
        reader = _Reader(directory, stack, index.get("files"))
        for h in held:  # every file and block this rank reads, before any value moves
            for kind in KINDS:
                blocks = index["tensors"].get(kind, {}).get(h.smap.name, [])
                for file, key, _, sizes, *start in blocks:
                    reader.check(file, key, sizes, *start)
        for h in held:
            name = h.smap.name
            saved = index["params"].get(name)
            if saved is None or list(saved.get("shape", [])) != list(h.smap.shape):
                raise CheckpointError(
                    f"parameter {name!r} of shape {list(h.smap.shape)} does not match the "
                    f"checkpoint {directory} ({saved['shape'] if saved else 'absent'}); was it "
                    "saved from another model or preset?"
                )
            step = index["steps"].get(name)
            for kind in KINDS:
                if kind not in h.flats or (kind != "param" and step is None):
                    continue
                blocks = index["tensors"].get(kind, {}).get(name, [])
                for box, view in _regions(h, kind):
                    _fill(reader, blocks, box, view, f"{kind} of {name!r}")
            if step is not None:
                h.set_step(float(step))
    if optimizer is not None and index.get("optimizer"):
        saved = {k: v for k, v in index["optimizer"].items() if k != "weight_decay"}
        for group in optimizer.param_groups:  # each group keeps its own weight decay
            group.update({k: tuple(v) if k == "betas" else v for k, v in saved.items()})
    if isinstance(model, GeminiModule):
        finish_gemini_load(model, optimizer if isinstance(optimizer, GeminiOptimizer) else None)
    scaler = _scaler(optimizer)
    if scaler is not None and index.get("scaler"):  # once, for either sharded optimizer
        scaler.load_state_dict(index["scaler"])
    if isinstance(optimizer, LowLevelZeroOptimizer):
        optimizer.refresh_params()
        optimizer.zero_grad()
    return index


def load_layout_checkpoint(
    path: Path, model: nn.Module, optimizer: torch.optim.Optimizer | None = None
) -> dict[str, Any]:
    """Load a checkpoint of any layout and plugin ([Note: one reader] in ``_layout_legacy``)
    into a plain, unsharded ``model`` in this process (and Adam/AdamW ``optimizer``'s state:
    moments, steps, hyperparameters); ``path`` is a ``step-N`` directory. Returns the index."""
    return load_layout(model, optimizer, None, Path(path))
