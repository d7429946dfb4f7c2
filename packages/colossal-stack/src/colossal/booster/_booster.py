"""The Booster: one object that applies a plugin to a model and its optimizer.

[Note: clean exit] A process that ends while a thread of its own is inside torch's C++ code (a
heartbeat's store call, a prefetch copy, a disk read, a collective's work) can abort in the
interpreter's shutdown ("terminate called without an active exception": the thread wakes to a
finalized interpreter and is unwound through a noexcept frame), so a job that succeeded is
reported as failed. ``Booster.close()`` joins every such thread before the process group is
destroyed: the plugin finishes its collectives in flight, shuts down its prefetch and disk
pools and destroys its own groups. The job calls it on every rank at the end; a Booster still
open at interpreter exit is closed then, locally (no collective: a peer may be gone).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from colossal_contracts import CheckpointError, ConfigError
from colossal_zero import Precision

from ..checkpoint._publish import MANIFEST, latest_checkpoint, verify_manifest, write_checkpoint_dir
from ..checkpoint._whole import write_checkpoint_dir_all_ranks
from ..lora import check_lora_optimizer
from ._ddp import DDPPlugin
from ._device import to_device
from ._plugin import Plugin

__all__ = ["TRAINER_FILE", "Booster", "read_trainer_file"]

TRAINER_FILE = "trainer.json"
_BOOSTED = "_colossal_boosted_by"  # set on a module once a Booster has configured it


class Booster:
    """``model, optimizer = Booster(plugin).boost(model, optimizer)``; then ``backward`` and
    ``optimizer.step()`` as usual. Checkpoints go through the plugin and are atomic."""

    def __init__(self, plugin: Plugin | None = None):
        if plugin is not None and not isinstance(plugin, Plugin):
            raise ConfigError(
                f"Booster(plugin) needs a plugin object such as GeminiPlugin() or DDPPlugin(), "
                f"got {type(plugin).__name__} {plugin!r}; build_plugin(name) makes one by name"
            )
        self.plugin: Plugin = plugin or DDPPlugin()
        # [Note: cpu matmul] in colossal_zero: decided once, from the CPU and COLOSSAL_CPU_MATMUL
        self._precision = Precision.parse(self.plugin.precision)
        self.matmul_note: str | None = self._precision.matmul_note(self.plugin.device)
        self._at_exit: _CloseAtExit | None = _CloseAtExit(self.plugin)  # [Note: clean exit]
        atexit.register(self._at_exit)

    def close(self) -> None:
        """Finish the plugin's collectives in flight, join its background threads and destroy
        its own process groups (every rank calls it; see [Note: clean exit]). Idempotent; the
        model and optimizer cannot train after it."""
        if self._at_exit is not None:
            atexit.unregister(self._at_exit)
            self._at_exit = None
            self.plugin.close(collective=True)

    def boost(
        self, model: nn.Module, optimizer: torch.optim.Optimizer
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        """Configure ``model`` and ``optimizer`` for the plugin; ``ConfigError`` for wrong types
        or a model that was boosted already (boost the original model once)."""
        if not isinstance(model, nn.Module):
            raise ConfigError(f"boost() needs an nn.Module as model, got {type(model).__name__}")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise ConfigError(
                f"boost() needs a torch.optim.Optimizer built on the model's parameters, got "
                f"{type(optimizer).__name__}"
            )
        check_lora_optimizer(model, optimizer)  # LoRA trains with Adam/AdamW
        done = model.__dict__.get(_BOOSTED) or self.plugin.unwrap(model).__dict__.get(_BOOSTED)
        if done:
            raise ConfigError(
                f"this model was boosted already (by the {done} plugin); boost a model once and "
                "keep using the model and optimizer that boost() returned"
            )
        boosted, opt = self.plugin.configure(model, optimizer)
        for m in (model, boosted):
            m.__dict__[_BOOSTED] = self.plugin.name
        return boosted, opt

    def compute(self) -> contextlib.AbstractContextManager[object]:
        """The context to run forward and backward in: bf16/fp16 matmuls computed in fp32
        where this CPU lacks fast kernels for them (``matmul_note`` says so; [Note: cpu
        matmul] in colossal_zero), else one that does nothing. ``with booster.compute():
        loss = booster.train_step(x, y, model, optimizer)``."""
        if self.matmul_note is None:
            return contextlib.nullcontext()
        return self._precision.compute(self.plugin.device, setting="fp32")

    def backward(self, loss: torch.Tensor, optimizer: torch.optim.Optimizer) -> None:
        self.plugin.backward(loss, optimizer)

    def execute_pipeline(
        self,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
    ) -> torch.Tensor:
        """Forward and backward of one batch through the plugin's pipeline schedule (plugins
        without one: ``model(inputs, targets)`` then ``backward``); returns the mean loss."""
        return self.plugin.execute_pipeline(inputs, targets, model, optimizer)

    def train_step(
        self,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        microbatches: int = 1,
        on_loss: Callable[[torch.Tensor], float] | None = None,
    ) -> float:
        """Forward and backward of one batch, in ``microbatches`` gradient-accumulation steps
        (a pipelined model: through its schedule); the mean loss. ``on_loss`` sees each loss
        before its backward and returns the value averaged (default: ``loss.item()``). Then
        ``optimizer.step()`` as usual."""
        return self.plugin.train_step(
            inputs, targets, model, optimizer, microbatches=microbatches, on_loss=on_loss
        )

    def evaluate(
        self, inputs: torch.Tensor, targets: torch.Tensor, model: nn.Module
    ) -> torch.Tensor:
        """The batch's mean loss, forward only (a pipelined model: through its schedule)."""
        return self.plugin.evaluate(inputs, targets, model)

    def unwrap(self, model: nn.Module) -> nn.Module:
        return self.plugin.unwrap(model)

    @property
    def device(self) -> torch.device:
        """Where the plugin computes ([Note: plugin device])."""
        return self.plugin.device

    def to_device(self, batch: Any) -> Any:
        """``batch`` (a tensor, or a tuple/list/dict of them) on the plugin's device."""
        return to_device(batch, self.plugin.device)

    def memory_stats(self) -> dict[str, Any]:
        return self.plugin.memory_stats()

    def save(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        root: Path,
        *,
        step: int,
        extra: dict[str, Any] | None = None,
    ) -> Path | None:
        """Save a checkpoint ``root/step-<step>`` (rank 0 publishes it); returns its path on rank 0.

        ``trainer.json`` beside the plugin's files records ``step`` and ``extra``.
        """
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0

        def write(directory: Path) -> None:
            self.plugin.save_checkpoint(model, optimizer, directory)
            if rank == 0:
                info = {"step": step, "plugin": self.plugin.name, **(extra or {})}
                (directory / TRAINER_FILE).write_text(json.dumps(info, indent=2, default=str))

        try:
            if self.plugin.sharded_checkpoint:  # every rank writes its shard
                return write_checkpoint_dir_all_ranks(root, step, write, rank=rank)
            path = write_checkpoint_dir(root, step, write) if rank == 0 else None
        except OSError as err:  # a full disk, a quota, a folder gone: the earlier ones stay
            where = f" ({err.filename})" if err.filename else ""
            raise CheckpointError(
                f"saving step {step} under {root} failed: {err.strerror or err}{where}; the "
                "checkpoints saved before it are intact: free space (or choose another --out) "
                "and continue with --resume"
            ) from err
        if dist.is_available() and dist.is_initialized():
            dist.barrier()
        return path

    def load(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, root: Path
    ) -> dict[str, Any]:
        """Restore the checkpoint ``root/latest`` names (else the newest complete ``step-N``
        under ``root``, or ``root`` itself when it is one); return its ``trainer.json`` with
        ``path`` added. A checkpoint of any plugin and layout loads ([Note: one reader] in
        ``_layout_legacy``). Files are checked against the manifest first; metadata of the wrong
        shape and steps that disagree (folder, manifest, ``trainer.json``) are a
        ``CheckpointError`` naming the file and the field; nothing is restored unless the
        plugin's loader proved the checkpoint whole first."""
        root = Path(root)
        own = (root / TRAINER_FILE).is_file() or (root / MANIFEST).is_file()
        path = root if own else latest_checkpoint(root)
        manifest_step = verify_manifest(path)
        info = read_trainer_file(path)
        if info["step"] != manifest_step:
            raise CheckpointError(
                f"{path / TRAINER_FILE}: 'step' is {info['step']}, and {MANIFEST} (and the folder "
                f"{path.name}) say {manifest_step}; the file was edited or comes from another "
                "checkpoint: resume from another step-N directory"
            )
        # every plugin reads every plugin's checkpoint ([Note: one reader] in _layout_legacy)
        self.plugin.load_checkpoint(model, optimizer, path)
        return {**info, "path": path}


class _CloseAtExit:
    """Closes a plugin still open at interpreter exit, locally ([Note: clean exit]). Holds it
    weakly: a Booster dropped while its model trains on must not close anything."""

    def __init__(self, plugin: Plugin):
        self._plugin = weakref.ref(plugin)

    def __call__(self) -> None:
        plugin = self._plugin()
        if plugin is None:
            return
        with contextlib.suppress(Exception):  # at exit, after the run's own error was printed
            plugin.close(collective=False)


def read_trainer_file(path: Path) -> dict[str, Any]:
    """``trainer.json`` of the checkpoint ``path``: an object with a non-negative int ``step``."""
    try:
        info = json.loads((path / TRAINER_FILE).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"checkpoint {path} has no readable {TRAINER_FILE}: {err}") from err
    if not isinstance(info, dict):
        raise CheckpointError(f"{path / TRAINER_FILE} must hold a JSON object")
    step = info.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise CheckpointError(
            f"{path / TRAINER_FILE} has no valid 'step' (a non-negative int), got {step!r}; "
            "the file was edited or damaged: resume from another step-N directory"
        )
    if not isinstance(info.get("train_config", {}), dict):
        raise CheckpointError(f"{path / TRAINER_FILE}: 'train_config' must be an object")
    return info
