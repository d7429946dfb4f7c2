"""Reading a sharded checkpoint ([Note: sharded checkpoint layout] in ``_layout.py``): element
ranges of saved tensors into a rank's shards, the loss scaler and the buffers, and the whole
state dict offline (``consolidate``).

[Note: whole or not at all] Before any value reaches the model, loading proves the checkpoint
whole: each parameter's ranges cover every element of its flattened shape exactly once (sorted,
no gap, no overlap, ranks within ``world_size``), and every file named by a range holds
``param/<name>`` (and, with optimizer state, ``exp_avg``/``exp_avg_sq``) of exactly that range's
length, and some file holds ``step/<name>``. An index edited so that a tensor is half covered,
with its hashes recomputed, is refused naming the file and the parameter.

[Note: omitted frozen values] Saved with ``frozen_values=False`` (a LoRA run's checkpoints),
frozen parameters are neither written nor listed in ``params``; the index names them under
``frozen_omitted``. A load then keeps the values the model's frozen parameters have (rebuilt
from their source by the caller, which checks them: the job against the base fingerprint), and
refuses a name omitted there that trains in the model.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import nn

from colossal_contracts import CheckpointError

from .._safetensors_stream import SafetensorsRangeReader
from ..optim._adam import STATE_KINDS
from ..optim._scaler import DynamicLossScaler
from ._index import validate_index
from ._layout import BUFFERS_FILE, INDEX_FILE, file_digest, shard_file

__all__ = ["CheckpointReader", "consolidate"]


class CheckpointReader:
    """Reads element ranges of saved tensors from the shard files of a checkpoint."""

    def __init__(self, directory: Path):
        self.directory = directory
        try:
            self.index = json.loads((directory / INDEX_FILE).read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise CheckpointError(
                f"{directory} has no readable {INDEX_FILE}: {err}; is it a Gemini checkpoint?"
            ) from err
        validate_index(self.index, directory / INDEX_FILE)
        self._files: dict[int, SafetensorsRangeReader] = {}
        self._keys: dict[int, set[str]] = {}

    def check_shape(self, name: str, shape: list[int]) -> None:
        """``CheckpointError`` unless the checkpoint saved parameter ``name`` with ``shape``."""
        saved = self.index["params"].get(name)
        if saved is None or shape != saved["shape"]:
            raise CheckpointError(
                f"parameter {name!r} of shape {shape} does not match the checkpoint "
                f"{self.directory} ({saved['shape'] if saved else 'absent'}); same model and preset?"
            )

    def verify(self, name: str) -> Path:
        """The path of the checkpoint file ``name``, after checking it against the index's
        digest (indexes without ``files``, from before checksums, are not checked)."""
        path = self.directory / name
        want = self.index.get("files", {}).get(name)
        if want is not None:
            if not path.is_file():
                raise CheckpointError(f"checkpoint file {path} is missing")
            if file_digest(path) != want:
                raise CheckpointError(
                    f"checkpoint file {path} does not match the checksum in {INDEX_FILE}: it "
                    "was changed or copied from another checkpoint; restore the original file"
                )
        return path

    def check_whole(self, names: Iterable[str], *, optimizer: bool) -> None:
        """Prove the saved values of the parameters ``names`` complete before anything is read
        into a model (see [Note: whole or not at all]); ``CheckpointError`` naming the file."""
        kinds = ("param", *STATE_KINDS) if optimizer else ("param",)
        index_path = self.directory / INDEX_FILE
        for name in names:
            meta = self.index["params"][name]
            has_step = False
            for rank, a, b in meta["ranges"]:
                f = self._file(rank)
                for kind in kinds:
                    got = f.numel(f"{kind}/{name}")
                    if got != b - a:
                        held = "absent" if got is None else f"{got} elements"
                        raise CheckpointError(
                            f"{f.path}: '{kind}/{name}' is {held}, and {index_path} gives it "
                            f"range [{a}, {b}) ({b - a} elements); the checkpoint is incomplete: "
                            "resume from another checkpoint"
                        )
                has_step = has_step or f.numel(f"step/{name}") == 1
            if optimizer and not has_step and meta["ranges"]:
                raise CheckpointError(
                    f"{self.directory}: no shard file holds 'step/{name}' (Adam's step count) "
                    f"though {index_path} says 'optimizer' is true; resume from another checkpoint"
                )

    def _file(self, rank: int) -> SafetensorsRangeReader:
        if rank not in self._files:
            path = self.verify(shard_file(rank, self.index["world_size"]))
            self._files[rank] = SafetensorsRangeReader(path)
            self._keys[rank] = self._files[rank].keys()
        return self._files[rank]

    def read_into(self, kind: str, name: str, start: int, out: torch.Tensor) -> bool:
        """Elements ``[start, start + out.numel())`` of the flattened ``kind/name`` into ``out``
        (read from each rank's file that holds some); False if it was not saved."""
        meta = self.index["params"].get(name)
        if meta is None:
            raise CheckpointError(
                f"{self.directory} has no parameter {name!r}; was it saved from another model?"
            )
        end = start + out.numel()
        for rank, a, b in meta["ranges"]:
            lo, hi = max(a, start), min(b, end)
            if lo >= hi:
                continue
            f = self._file(rank)
            key = f"{kind}/{name}"
            if key not in self._keys[rank]:
                return False
            f.read_into(key, lo - a, out[lo - start : hi - start])
        return True

    def read(
        self, kind: str, name: str, start: int, end: int, dtype: torch.dtype = torch.float32
    ) -> torch.Tensor | None:
        """Elements ``[start, end)`` of the flattened ``kind/name`` in ``dtype``; None if it was
        not saved."""
        out = torch.empty(end - start, dtype=dtype)
        return out if self.read_into(kind, name, start, out) else None

    def read_saved(
        self, kind: str, name: str, start: int, end: int, dtype: torch.dtype = torch.float32
    ) -> torch.Tensor:
        """``read``, for a tensor the checkpoint must hold (proved by ``check_whole``):
        ``CheckpointError`` naming it when it does not."""
        out = self.read(kind, name, start, end, dtype)
        if out is None:
            raise CheckpointError(
                f"{self.directory} holds no '{kind}/{name}'; the checkpoint is incomplete: "
                "resume from another checkpoint"
            )
        return out

    def step(self, name: str) -> float | None:
        """Adam's saved step count of parameter ``name``; None if it was not saved."""
        for rank, _, _ in self.index["params"][name]["ranges"]:
            f = self._file(rank)
            if f"step/{name}" in self._keys[rank]:
                return float(f.get(f"step/{name}")[0])
        return None

    def restore_step(self, steps: dict[str, torch.Tensor], name: str) -> None:
        """Set ``steps[name]`` (a float32 scalar) to the saved step count, when one was saved."""
        step = self.step(name)
        if step is not None:
            steps[name] = torch.tensor(step, dtype=torch.float32)

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()

    def restore_scaler(self, scaler: DynamicLossScaler | None) -> None:
        """Load the saved loss scaler's state into ``scaler`` (when both exist)."""
        if scaler is not None and self.index.get("scaler"):
            scaler.load_state_dict(self.index["scaler"])

    @contextmanager
    def _buffers(self) -> Iterator[Any]:
        """The buffers file, open and checked against the index; None when none was saved."""
        path = self.directory / BUFFERS_FILE
        if not path.exists():
            yield None
            return
        self.verify(BUFFERS_FILE)
        with safe_open(str(path), framework="pt") as f:
            yield f

    def load_buffers(self, module: nn.Module) -> None:
        """Copy the saved buffers into ``module``'s buffers of the same names (the buffers
        file checked against the index first); buffers not saved keep their values."""
        with self._buffers() as f:
            if f is None:
                return
            own = dict(module.named_buffers())
            for n in list(f.keys()):
                if n in own:
                    own[n].copy_(f.get_tensor(n))

    def buffers(self) -> dict[str, torch.Tensor]:
        """Every saved buffer by name (none when no buffers file was saved)."""
        with self._buffers() as f:
            return {} if f is None else {n: f.get_tensor(n) for n in list(f.keys())}


def omitted_frozen(index: dict[str, Any], frozen: set[str], directory: Path) -> set[str]:
    """The parameters a sharded checkpoint saved without values ([Note: omitted frozen
    values]); ``CheckpointError`` when one of them trains in the model being loaded."""
    omitted = set(index.get("frozen_omitted", []))
    trains = sorted(omitted - frozen)
    if trains:
        raise CheckpointError(
            f"{directory / INDEX_FILE} saved {trains[0]!r} (and {len(trains) - 1} more) without "
            "values as frozen, and it trains in this model; resume with the run's LoRA settings "
            "(--lora-rank ...) or from a checkpoint that holds every weight"
        )
    return omitted


def consolidate(directory: Path) -> dict[str, torch.Tensor]:
    """The full fp32 state dict (every name, tied ones included, and buffers) of a sharded
    checkpoint, loadable by ``module.load_state_dict``; frozen parameters saved without their
    values ([Note: omitted frozen values]) are absent. Needs no process group."""
    reader = CheckpointReader(directory)
    full: dict[str, torch.Tensor] = {}
    for name, meta in reader.index["params"].items():
        numel = 1
        for d in meta["shape"]:
            numel *= d
        full[name] = reader.read_saved("param", name, 0, numel).view(meta["shape"])
    reader.close()
    out = {a: full[c].clone() for a, c in reader.index["aliases"].items() if c in full}
    out.update(reader.buffers())
    return out
