"""Reading a finished checkpoint of any plugin in one process: which model it holds and its
full fp32 weights under the names the trained module gave them.

[Note: checkpoint sources] Each plugin leaves the weights in its own form; the first of these a
``step-N`` directory holds is read:

1. ``layout_index.json`` (hybrid plugin): blocks of every layout, assembled tensor by tensor;
2. ``model.safetensors.index.json`` (Gemini's consolidated export, with or without tp);
3. ``model.safetensors`` (DDP's checkpoint, ZeRO's consolidated export);
4. ``gemini_index.json`` (a Gemini or ZeRO checkpoint saved with ``--export none``): the
   sharded state consolidated offline. Gemini with tp keeps one such folder per tp rank and
   needs (2).

The model comes from ``trainer.json`` (``train_config.model`` and ``model_config``, written by
``colossal train``), else from the layout index's ``model`` record.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from colossal_contracts import CheckpointError
from colossal_zero import consolidate
from colossal_zero.checkpoint import INDEX_FILE

from ..booster import HF_INDEX, find_checkpoint, iter_full_tensors
from ..booster._booster import TRAINER_FILE
from ..checkpoint._layout import LAYOUT_INDEX

__all__ = ["CheckpointInfo", "iter_checkpoint_state", "read_checkpoint"]


@dataclass(frozen=True)
class CheckpointInfo:
    """A finished checkpoint and the model in it.

    Attributes:
        path: the ``step-N`` directory.
        model: "gpt", "palm" or "hf:PATH" (``--model`` of the run).
        model_config: our config's fields (gpt, palm; also a layout index's ``model``), or for
            ``hf:`` the record ``{"hf_path", "model_type", "hf_config"}``.
        layout_model: the layout index's ``{"class", "config"}`` (what a hybrid or tp run
            trained, which for ``hf:`` is the adapted GPT or PaLM); None when absent.
        train_config: the run's settings as ``colossal train`` recorded them (strings).
        tokenizer: the tokenizer the run resolved (``bytes`` or ``hf:PATH``, trainer.json's
            ``tokenizer``); None in a checkpoint written before that record.
        lora: a LoRA run's record (trainer.json's ``lora``: rank, alpha, targets, dropout,
            ``target_modules``, ``base_fingerprint``); None for full fine-tuning.
    """

    path: Path
    model: str
    model_config: dict[str, Any]
    layout_model: dict[str, Any] | None = None
    train_config: dict[str, Any] = field(default_factory=dict)
    tokenizer: str | None = None
    lora: dict[str, Any] | None = None


def _step_dir(path: Path) -> Path:
    """The ``step-N`` directory ``path`` is, or holds (as a run's ``--out`` or its
    ``checkpoint`` root); ``CheckpointError`` naming what was expected otherwise."""
    path = Path(path)
    if (path / TRAINER_FILE).is_file() or (path / LAYOUT_INDEX).is_file():
        return path
    for root in (path, path / "checkpoint"):
        found = find_checkpoint(root) if root.is_dir() else None
        if found is not None:
            return found
    raise CheckpointError(
        f"{path} is not a checkpoint: expected a run's --out folder, its checkpoint/ folder or "
        "a step-N folder (with trainer.json), as colossal train writes them"
    )


def read_checkpoint(path: Path) -> CheckpointInfo:
    """The checkpoint at ``path`` (see ``_step_dir``) and the model it holds."""
    step = _step_dir(path)
    trainer: dict[str, Any] = {}
    if (step / TRAINER_FILE).is_file():
        try:
            trainer = json.loads((step / TRAINER_FILE).read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise CheckpointError(f"{step / TRAINER_FILE} is unreadable: {err}") from err
    layout = None
    if (step / LAYOUT_INDEX).is_file():
        try:
            layout = json.loads((step / LAYOUT_INDEX).read_text()).get("model")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError) as err:
            raise CheckpointError(f"{step / LAYOUT_INDEX} is unreadable: {err}") from err
    train_config = trainer.get("train_config") if isinstance(trainer, dict) else None
    train_config = train_config if isinstance(train_config, dict) else {}
    model, config = train_config.get("model"), trainer.get("model_config")
    if not (isinstance(model, str) and isinstance(config, dict)):
        if not isinstance(layout, dict):
            raise CheckpointError(
                f"checkpoint {step} does not say which model it holds (no model_config in "
                f"{TRAINER_FILE}); export checkpoints written by colossal train"
            )
        model, config = str(layout.get("class", "")).lower(), layout.get("config", {})
    tokenizer = trainer.get("tokenizer") if isinstance(trainer, dict) else None
    tokenizer = tokenizer if isinstance(tokenizer, str) else None
    lora = trainer.get("lora") if isinstance(trainer, dict) else None
    if lora is not None and not (isinstance(lora, dict) and "target_modules" in lora):
        raise CheckpointError(f"{step / TRAINER_FILE}: 'lora' is malformed (no target_modules)")
    return CheckpointInfo(step, model, config, layout, train_config, tokenizer, lora)


def _iter_safetensors(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
                    yield name, f.get_tensor(name).float()
        except (OSError, SafetensorError) as err:
            raise CheckpointError(f"checkpoint file {file} is missing or corrupt: {err}") from err


def iter_checkpoint_state(info: CheckpointInfo) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, full fp32 tensor)`` of every weight in the checkpoint, one at a time where the
    format allows (see [Note: checkpoint sources]); names as the trained module had them."""
    step = info.path
    if (step / LAYOUT_INDEX).is_file():
        yield from iter_full_tensors(step)
    elif (step / HF_INDEX).is_file():
        try:
            weight_map = json.loads((step / HF_INDEX).read_text())["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise CheckpointError(f"{step / HF_INDEX} is unreadable: {err}") from err
        yield from _iter_safetensors([step / f for f in dict.fromkeys(weight_map.values())])
    elif (step / "model.safetensors").is_file():
        yield from _iter_safetensors([step / "model.safetensors"])
    elif (step / INDEX_FILE).is_file():
        yield from ((n, t.float()) for n, t in consolidate(step).items())
    else:
        folders = sorted(p.name for p in step.glob("tp*-of-*"))
        hint = (
            f"it holds tensor-parallel shards ({', '.join(folders[:2])}...) without the "
            "consolidated model; train with --export final (the default)"
            if folders
            else "it holds no weights colossal knows"
        )
        raise CheckpointError(f"checkpoint {step}: {hint}")
