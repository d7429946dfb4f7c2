"""Whole-model checkpoints with safetensors (the DDP plugin's format), written atomically
through ``_publish`` (see [Note: atomic checkpoints] there)."""

from __future__ import annotations

import json
from collections.abc import Set
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from colossal_contracts import CheckpointError
from colossal_zero.checkpoint import INDEX_FILE

from ._publish import write_checkpoint_dir

__all__ = [
    "load_model_and_optimizer",
    "save_model_and_optimizer",
    "write_checkpoint_dir_all_ranks",
]


def _model_tensors(model: nn.Module, omit: Set[str] = frozenset()) -> dict[str, torch.Tensor]:
    """State dict with shared storages (tied embeddings) kept once under their first name,
    without the names in ``omit``."""
    out: dict[str, torch.Tensor] = {}
    seen: set[tuple[int, int]] = set()
    for name, t in model.state_dict().items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset())
        if (key in seen and t.numel() > 0) or name in omit:
            continue
        seen.add(key)
        out[name] = t.detach().contiguous().cpu()
    return out


def _optimizer_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    sd = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    state_meta: dict[str, dict[str, Any]] = {}
    for pid, st in sd["state"].items():
        for k, v in st.items():
            if isinstance(v, torch.Tensor):
                tensors[f"state.{pid}.{k}"] = v.detach().contiguous().cpu()
            else:
                state_meta.setdefault(str(pid), {})[k] = v
    return tensors, {"param_groups": sd["param_groups"], "scalar_state": state_meta}


def save_model_and_optimizer(
    directory: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    meta: dict,
    *,
    frozen_values: bool = True,
) -> None:
    """Write ``model.safetensors``, ``optimizer.safetensors`` and ``meta.json`` into
    ``directory``; ``meta.json``'s ``param_names`` names the parameter of each optimizer state
    number (None for one not in ``model``). ``frozen_values=False`` leaves frozen parameters
    out, named in ``meta.json``'s ``frozen_omitted`` (their values are the loading model's:
    colossal-zero's [Note: omitted frozen values])."""
    omit = {n for n, p in model.named_parameters(remove_duplicate=False) if not p.requires_grad}
    if frozen_values:
        omit = set()
    else:
        meta = {**meta, "frozen_omitted": sorted(omit)}
    save_file(_model_tensors(model, omit), str(directory / "model.safetensors"))
    if optimizer is not None:
        tensors, opt_meta = _optimizer_tensors(optimizer)
        save_file(tensors, str(directory / "optimizer.safetensors"))
        # the parameter each optimizer state number stands for, so any layout can read them
        names = {id(p): n for n, p in model.named_parameters()}
        ordered = [names.get(id(p)) for g in optimizer.param_groups for p in g["params"]]
        meta = {**meta, "optimizer": opt_meta, "param_names": ordered}
    (directory / "meta.json").write_text(json.dumps(meta, indent=2, default=str))


def write_checkpoint_dir_all_ranks(root: Path, step: int, write: Any, *, rank: int) -> Path | None:
    """``write_checkpoint_dir`` for plugins whose every rank writes a shard: rank 0 makes the
    temporary directory and tells the others its name; all call ``write(tmpdir)``; after a barrier
    rank 0 alone fsyncs and publishes it ([Note: atomic checkpoints] holds). Collective."""
    distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    if not distributed:
        return write_checkpoint_dir(root, step, write)

    def publish_after_all(tmp: Path) -> None:
        dist.broadcast_object_list([str(tmp)], src=0)
        write(tmp)
        dist.barrier()

    if rank == 0:
        path = write_checkpoint_dir(root, step, publish_after_all)
    else:
        name: list[Any] = [None]
        dist.broadcast_object_list(name, src=0)
        write(Path(name[0]))
        dist.barrier()
        path = None
    dist.barrier()  # the checkpoint is published before anyone goes on
    return path


def load_model_and_optimizer(
    directory: Path, model: nn.Module, optimizer: torch.optim.Optimizer | None
) -> dict:
    """Restore into ``model`` (and ``optimizer``); return the saved meta. Corruption, another
    plugin's format and malformed metadata are a ``CheckpointError`` saying which."""
    if not (directory / "meta.json").exists() and (directory / INDEX_FILE).exists():
        raise CheckpointError(
            f"{directory} is a Gemini (sharded) checkpoint, not the DDP plugin's; resume it with "
            "--plugin gemini, or load its consolidated model.safetensors into a plain model"
        )
    try:
        meta = json.loads((directory / "meta.json").read_text())
        tensors = load_file(str(directory / "model.safetensors"))
    except (OSError, json.JSONDecodeError, SafetensorError) as err:
        raise CheckpointError(f"checkpoint {directory} is unreadable or corrupt: {err}") from err
    if not isinstance(meta, dict):
        raise CheckpointError(f"{directory / 'meta.json'} must hold a JSON object")
    own = model.state_dict()
    frozen = {n for n, p in model.named_parameters(remove_duplicate=False) if not p.requires_grad}
    omitted = set(meta.get("frozen_omitted", []))
    if omitted - frozen:
        raise CheckpointError(
            f"{directory / 'meta.json'} saved {sorted(omitted - frozen)[0]!r} without values as "
            "frozen, and it trains in this model; resume with the run's LoRA settings"
        )
    for name, t in tensors.items():  # [Note: whole or not at all]: shapes before any copy
        if name in own and tuple(own[name].shape) != tuple(t.shape):
            raise CheckpointError(
                f"{directory / 'model.safetensors'}: {name!r} has shape {list(t.shape)}, the "
                f"model's is {list(own[name].shape)}; was it saved from another model or preset?"
            )
    missing = [n for n in own if n not in tensors and n not in omitted]  # omitted: kept
    unexpected = [n for n in tensors if n not in own]
    tied = {n for n in missing if _is_tied(model, n, tensors)}
    if set(missing) - tied or unexpected:
        raise CheckpointError(
            f"checkpoint {directory} does not match the model: missing {sorted(set(missing) - tied)}, "
            f"unexpected {sorted(unexpected)}; was it saved from another model or preset?"
        )
    state = None
    if optimizer is not None and "optimizer" in meta:
        try:
            opt_tensors = load_file(str(directory / "optimizer.safetensors"))
        except (OSError, SafetensorError) as err:
            raise CheckpointError(f"optimizer state in {directory} is corrupt: {err}") from err
        try:
            state = _rebuild_optimizer_state(opt_tensors, meta["optimizer"])
            _check_optimizer_whole(state, optimizer)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as err:
            raise CheckpointError(
                f"optimizer metadata in {directory / 'meta.json'} is malformed or belongs to "
                f"another optimizer ({type(err).__name__}: {err}); resume from another step-N"
            ) from err
    model.load_state_dict(tensors, strict=False)
    if state is not None and optimizer is not None:  # (state is read only with an optimizer)
        optimizer.load_state_dict(state)
    return meta


def _is_tied(model: nn.Module, name: str, saved: dict[str, torch.Tensor]) -> bool:
    sd = model.state_dict()
    ptr = sd[name].untyped_storage().data_ptr()
    return any(sd[o].untyped_storage().data_ptr() == ptr for o in saved if o in sd and o != name)


def _check_optimizer_whole(state: dict, optimizer: torch.optim.Optimizer) -> None:
    """``ValueError`` unless ``state`` holds, for every trainable parameter of ``optimizer``, the
    same state keys with tensors of the parameter's shape (or no state at all: before a step)."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    ids = [i for g in state["param_groups"] for i in g["params"]]
    if len(ids) != len(params):
        raise ValueError(f"{len(ids)} parameters saved, the optimizer has {len(params)}")
    if not state["state"]:
        return
    keys: set[str] | None = None
    for i, p in zip(ids, params, strict=True):
        if not p.requires_grad:
            continue
        st = state["state"].get(i)
        if st is None:
            raise ValueError(f"no state for parameter {i} though others have some")
        keys = set(st) if keys is None else keys
        if set(st) != keys:
            raise ValueError(f"parameter {i} has state {sorted(st)}, the others {sorted(keys)}")
        for k, v in st.items():
            if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape != p.shape:
                raise ValueError(
                    f"state {k!r} of parameter {i} has shape {list(v.shape)}, "
                    f"the parameter {list(p.shape)}"
                )


def _rebuild_optimizer_state(tensors: dict[str, torch.Tensor], meta: dict) -> dict:
    state: dict[int, dict[str, Any]] = {}
    for key, t in tensors.items():
        _, pid, name = key.split(".", 2)
        state.setdefault(int(pid), {})[name] = t
    for pid, scalars in meta.get("scalar_state", {}).items():
        state.setdefault(int(pid), {}).update(scalars)
    return {"state": state, "param_groups": meta["param_groups"]}
