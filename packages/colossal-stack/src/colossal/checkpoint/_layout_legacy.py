"""The other checkpoint formats as layout indexes, so one reader loads every checkpoint.

[Note: one reader] Every plugin resumes every plugin's checkpoint through ``load_layout``
([Note: layout checkpoint] in ``_layout``). Its index names, per tensor, blocks of
the unsharded tensor and where each lies in a file; the two formats written without a mesh
are described by such an index over their own files, built here from their metadata alone:

- the DDP plugin's (``meta.json``, ``model.safetensors``, ``optimizer.safetensors``): every
  tensor whole, a block ``[file, key, zeros, shape]``; Adam's state is keyed by the optimizer's
  parameter number, named through ``meta.json``'s ``param_names``;
- colossal-zero's sharded one (``gemini_index.json``: Gemini without a mesh, ZeRO-1/2): each
  rank's file holds a run ``[a, b)`` of every flattened tensor it holds, cut into boxes by
  ``flat_range_boxes``, a block ``[file, key, offsets, sizes, start]`` each (``start``: where
  the box's elements begin in the saved 1-D run). Its files' checksums are checked as each
  is first read.

So no converter runs and no unsharded tensor is built: the loading layout reads the slices it
holds, after the same proof that the index covers every element once.
"""

from __future__ import annotations

import json
import math
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from safetensors import SafetensorError, safe_open

from colossal_contracts import CheckpointError
from colossal_models.sharding import flat_range_boxes
from colossal_zero.checkpoint import INDEX_FILE

from ._layout_read import (
    KINDS,
    LAYOUT_FORMAT,
    LAYOUT_INDEX,
    _Reader,
    check_layout_index,
    read_layout_index,
)

__all__ = ["DDP_META", "checkpoint_index"]

DDP_META = "meta.json"  # the DDP plugin's checkpoint metadata (see ``_checkpoint``)
_HYPER = ("lr", "betas", "eps")


def checkpoint_index(directory: Path) -> dict[str, Any]:
    """The layout index of the checkpoint ``directory`` in any format ([Note: one reader]),
    proved whole; ``CheckpointError`` when it is none of them, or damaged."""
    d = Path(directory)
    if (d / LAYOUT_INDEX).is_file():
        return read_layout_index(d)
    if (d / INDEX_FILE).is_file():
        source, build = d / INDEX_FILE, _sharded_index
    elif (d / DDP_META).is_file():
        source, build = d / DDP_META, _ddp_index
    else:
        raise CheckpointError(
            f"{d} holds no checkpoint: none of {LAYOUT_INDEX}, {INDEX_FILE} (Gemini, ZeRO) or "
            f"{DDP_META} (DDP) is in it; resume from a step-N directory"
        )
    try:
        raw = json.loads(source.read_text())
        index = build(d, raw)
        if isinstance(raw, dict) and raw.get("frozen_omitted"):  # a LoRA run's: base not saved
            index["frozen_omitted"] = list(raw["frozen_omitted"])
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, SafetensorError) as err:
        raise CheckpointError(f"checkpoint {d} is unreadable or corrupt: {err}") from err
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as err:
        raise CheckpointError(
            f"{source} is malformed ({type(err).__name__}: {err}); the file was edited or "
            "damaged: resume from another step-N directory"
        ) from err
    check_layout_index(index, source)
    return index


def _index(params: dict, tensors: dict, steps: dict, **rest: Any) -> dict[str, Any]:
    return {"format": LAYOUT_FORMAT, "params": params, "tensors": tensors, "steps": steps, **rest}


def _ddp_index(d: Path, meta: dict[str, Any]) -> dict[str, Any]:
    model_file, opt_file = "model.safetensors", "optimizer.safetensors"
    with safe_open(str(d / model_file), framework="pt") as f:
        shapes = {k: list(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
    tensors: dict[str, dict[str, list]] = {k: {} for k in KINDS}
    for name, shape in shapes.items():
        tensors["param"][name] = [[model_file, name, [0] * len(shape), shape]]
    steps: dict[str, float] = {}
    opt = meta.get("optimizer")
    hyper = None
    if opt is not None:
        names = meta.get("param_names")
        if not isinstance(names, list):
            raise CheckpointError(
                f"{d / DDP_META} does not name the optimizer's parameters (a DDP checkpoint "
                "from before they were recorded): resume it with --plugin ddp"
            )
        with safe_open(str(d / opt_file), framework="pt") as f:
            keys = set(f.keys())
            scalars = opt.get("scalar_state", {})
            for pid, name in enumerate(names):
                if name is None:  # a parameter the saved model did not have
                    continue
                if f"state.{pid}.step" in keys:
                    steps[name] = float(f.get_tensor(f"state.{pid}.step"))
                elif "step" in scalars.get(str(pid), {}):
                    steps[name] = float(scalars[str(pid)]["step"])
                else:
                    continue  # never stepped: no moments either
                for kind in ("exp_avg", "exp_avg_sq"):
                    key = f"state.{pid}.{kind}"
                    shape = list(f.get_slice(key).get_shape()) if key in keys else None
                    if shape is not None:
                        tensors[kind][name] = [[opt_file, key, [0] * len(shape), shape]]
        group = opt["param_groups"][0]
        hyper = {k: group[k] for k in _HYPER if k in group}
    params = {n: {"shape": s} for n, s in shapes.items()}
    return _index(params, tensors, steps, optimizer=hyper, scaler=None, layout="ddp")


def _sharded_index(d: Path, raw: dict[str, Any]) -> dict[str, Any]:
    world = raw["world_size"]
    if not isinstance(world, int) or world < 1:
        raise ValueError(f"'world_size' must be a positive int, got {world!r}")
    files = [f"gemini-rank{r:05d}-of-{world:05d}.safetensors" for r in range(world)]
    digests = raw.get("files") or {}
    tensors: dict[str, dict[str, list]] = {k: {} for k in KINDS}
    params: dict[str, dict[str, Any]] = {}
    holders: dict[str, list[int]] = {}
    for name, meta in raw["params"].items():
        shape = [int(x) for x in meta["shape"]]
        params[name] = {"shape": shape}
        strides = [math.prod(shape[i + 1 :]) for i in range(len(shape))]
        for kind in KINDS:
            blocks = tensors[kind][name] = []
            for rank, a, b in meta["ranges"]:
                if not 0 <= rank < world:
                    raise ValueError(f"{name!r} names rank {rank}, outside world_size {world}")
                for box in flat_range_boxes(tuple(shape), a, b):
                    first = sum(o * s for o, s in zip(box.offsets, strides, strict=True))
                    key = f"{kind}/{name}"
                    blocks.append([files[rank], key, list(box.offsets), list(box.sizes), first - a])
        holders[name] = [r for r, _, _ in meta["ranges"]]
    steps: dict[str, float] = {}
    if raw.get("optimizer"):
        steps, checked = _sharded_steps(d, files, holders, digests)
        digests = {k: v for k, v in digests.items() if k not in checked}  # hashed once
    for kind in ("exp_avg", "exp_avg_sq"):  # moments only of what stepped
        tensors[kind] = {n: b for n, b in tensors[kind].items() if n in steps}
    return _index(
        params,
        tensors,
        steps,
        optimizer=None,
        scaler=raw.get("scaler"),
        files=digests,
        layout=raw.get("writer", "gemini"),
    )


def _sharded_steps(
    d: Path, files: list[str], holders: dict[str, list[int]], digests: dict[str, Any]
) -> tuple[dict[str, float], set[str]]:
    """Adam's step count of every parameter some rank's file holds one for, and the files
    read (each checked against its checksum as it was opened)."""
    steps: dict[str, float] = {}
    with ExitStack() as stack:
        reader = _Reader(d, stack, digests)
        for name, ranks in holders.items():
            for r in ranks:
                f = reader.open(files[r])
                if f"step/{name}" in f.keys():  # noqa: SIM118
                    steps[name] = float(f.get_tensor(f"step/{name}").reshape(-1)[0])
                    break
        return steps, set(reader.files)
