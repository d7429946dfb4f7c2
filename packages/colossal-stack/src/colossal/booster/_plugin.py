"""The Plugin Protocol: how a Booster and the training job hand a model and optimizer to a
training strategy, and everything they ask of one.

[Note: plugin hooks] The Booster and ``colossal train`` call every member below directly:
no ``isinstance`` on plugin classes, no ``getattr`` probes. A plugin subclasses ``Plugin`` and
implements the five methods without a default (``configure``, ``backward``, ``unwrap``,
``save_checkpoint``, ``load_checkpoint``); the defaults of the rest are the behaviour of a
strategy with no mesh, no pipeline, no accelerator budget, no background work and a
checkpoint written by rank 0 alone. A class that does not subclass ``Plugin`` must define
every member itself (``Booster`` checks with ``isinstance(plugin, Plugin)``).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from colossal_parallel import ProcessMesh
from colossal_zero import LazyInit

__all__ = ["Plugin"]


def _item(loss: torch.Tensor) -> float:
    return float(loss.item())


@runtime_checkable
class Plugin(Protocol):
    """A training strategy (plain data parallel, Gemini, tensor parallel ...).

    Invariant: after ``configure``, ``backward`` + ``step`` (or ``train_step`` + ``step``) on
    the returned objects perform one optimizer step equivalent to plain PyTorch on the global
    batch (within the strategy's documented numerical tolerance).

    Attributes:
        name: the strategy's name (``colossal train --plugin NAME``), recorded in checkpoints.
        device: where the model computes and batches go ([Note: plugin device]).
        mesh: the process mesh once ``configure`` built one (tensor, pipeline or sequence
            parallelism); None before, after ``close``, and for plugins without one, whose
            data-parallel group is every rank. Every rank of one ``mesh.coord("dp")`` is given
            the same batch.
        sharded_checkpoint: every rank writes its part of a checkpoint (``save_checkpoint`` is
            collective); False: rank 0 alone writes it.
        lazy: the ``colossal.lazy_init()`` context the model was built in, which ``configure``
            materializes where the model lives ([Note: lazy fill]); None: built eagerly (the
            job builds eagerly for DDP, which replicates the whole model anyway).
        precision: the precision the model computes in ("fp32", "bf16", "fp16", "fp64");
            ``Booster.compute()`` reads it ([Note: cpu matmul] in colossal_zero). Plugins that
            compute in the model's own dtype keep "fp32".
    """

    name: str
    device: torch.device
    mesh: ProcessMesh | None = None
    sharded_checkpoint: bool = False
    lazy: LazyInit | None = None
    precision: str = "fp32"

    def configure(
        self, model: nn.Module, optimizer: torch.optim.Optimizer
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        """Wrap or transform model and optimizer for this strategy."""
        ...

    def backward(self, loss: torch.Tensor, optimizer: torch.optim.Optimizer) -> None:
        """Backward of ``loss`` (scaling, hooks and gradient reduction as the strategy needs)."""
        ...

    def unwrap(self, model: nn.Module) -> nn.Module:
        """The user's module inside whatever ``configure`` returned."""
        ...

    def save_checkpoint(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, path: Path
    ) -> None:
        """Write model and optimizer state under the directory ``path`` (every rank calls it
        when ``sharded_checkpoint``, else rank 0 alone)."""
        ...

    def load_checkpoint(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, path: Path
    ) -> None:
        """Restore what ``save_checkpoint`` wrote."""
        ...

    # --- members with defaults ([Note: plugin hooks]) ----------------------------------------

    def execute_pipeline(
        self,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
    ) -> torch.Tensor:
        """Forward and backward of one batch through the plugin's pipeline schedule; the mean
        loss, detached. Default (no pipeline): ``model(inputs, targets)``, then ``backward``."""
        loss = model(inputs, targets)
        self.backward(loss, optimizer)
        return loss.detach()

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
        """Forward and backward of one batch (no optimizer step); the mean of the values
        ``on_loss`` returned. ``on_loss`` sees each loss before its backward (``colossal
        train``: averages it over the data-parallel ranks and stops on nan/inf); None:
        ``loss.item()``.

        Default: the rows are split into ``microbatches`` blocks, each loss scaled by
        ``1 / microbatches`` in its backward, so the gradients are the whole batch's; every
        backward but the last runs inside ``accumulating``. A plugin with a pipeline schedule
        runs the batch through it (its own micro-batches) and reports one loss."""
        n, report = microbatches, on_loss or _item
        total = 0.0
        for i, (x, y) in enumerate(zip(inputs.chunk(n), targets.chunk(n), strict=True)):
            loss = model(x, y)
            value = report(loss)
            with self.accumulating(optimizer) if i < n - 1 else nullcontext():
                self.backward(loss / n if n > 1 else loss, optimizer)
            total += value
        return total / n

    def accumulating(self, optimizer: torch.optim.Optimizer) -> AbstractContextManager[Any]:
        """The context the backwards of a step's earlier micro-batches run in: their gradients
        wait for the last one's. Default: none (Gemini's says so to its optimizer, which may
        then update in the last backward)."""
        return nullcontext()

    def evaluate(
        self, inputs: torch.Tensor, targets: torch.Tensor, model: nn.Module
    ) -> torch.Tensor:
        """The batch's mean loss, forward only (the model's train/eval mode is the caller's).
        Default: ``model(inputs, targets)`` without gradients."""
        with torch.no_grad():
            loss: torch.Tensor = model(inputs, targets)
        return loss

    def memory_stats(self) -> dict[str, Any]:
        """Per-tier memory and bytes moved, for progress displays and metrics (may be empty)."""
        return {}

    def label(self) -> str:
        """The strategy in one line for the job's banner, e.g. ``hybrid (dp2 x tp2(1d))``.
        Default: ``name``."""
        return self.name

    @property
    def num_stages(self) -> int:
        """Pipeline stages one model replica is cut into (pp times chunks per rank); 1 without
        a pipeline. The model needs at least this many blocks."""
        return 1

    def check_world(self, world_size: int) -> None:
        """``ConfigError`` unless this plugin's layout fits ``world_size`` ranks, before any
        process group exists. Default: any world size (data parallelism over every rank)."""
        return None

    def reserve_activations(self, estimate: Callable[[], int]) -> None:
        """Before ``configure``: a plugin that keeps model states under an accelerator budget
        keeps ``estimate()`` bytes free for one step's activations (memtrace's static
        estimate). Default: no budget; ``estimate`` is not called."""
        return None

    def choose_checkpoint_contents(self, *, export_full_model: bool, save_frozen: bool) -> None:
        """What the next ``save_checkpoint`` writes beside the state resuming needs: the
        consolidated model (``export_full_model``, where the state is sharded) and the values
        of frozen parameters (``save_frozen``; a LoRA run's base is rebuilt from its source).
        Default: the plugin writes what it always writes."""
        return None

    def close(self, *, collective: bool = True) -> None:
        """Join the strategy's background work and threads ([Note: clean exit] in the Booster);
        with ``collective`` also finish collectives in flight and destroy its own process
        groups (every rank calls it then). Idempotent; no training after it. Default: the
        plugin keeps no threads or groups of its own."""
        return None
