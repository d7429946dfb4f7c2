"""Gemini runs with a disk tier, the update in backward on or off ([Note: update in backward]),
as module-level functions that the tests also run on every rank of a ``World``."""

from __future__ import annotations

from pathlib import Path

import torch
from _checks_zero import rank_world
from _zero_model import batches, build, param_groups

from colossal_chunk import GradPhase
from colossal_contracts import TierName
from colossal_zero import GeminiConfig, GeminiOptimizer, apply_gemini

CHUNK = 8192  # elements: a 32 KiB fp32 shard
SHARD = CHUNK * 4


def disk_config(
    directory: str | Path, precision: str, update: bool | None, device: str = "cpu"
) -> GeminiConfig:
    """Budgets under which most fp32 values and Adam states of the tests' GPT live on disk."""
    rank, _ = rank_world()
    return GeminiConfig(
        precision=precision, device=device, chunk_numel=CHUNK, accelerator_bytes=4 * SHARD,
        host_bytes=4 * SHARD, disk_bytes=None, disk_dir=Path(directory) / f"rank{rank}",
        update_in_backward=update,
    )  # fmt: skip


def run(
    directory: str,
    precision: str,
    update: bool | None,
    steps: int,
    batch: int,
    *,
    accum: int = 1,
    schedule: bool = False,
    declare: bool = True,
    lr: float = 1e-2,
    device: str = "cpu",
) -> tuple[list[float], dict[str, torch.Tensor], list[int], list[int], list[int], list[float]]:
    """Train ``steps`` steps of ``accum`` micro-batches (the earlier ones inside
    ``accumulating()`` unless not ``declare``), with a step-decay lr schedule when ``schedule``.
    Returns the global mean
    loss per micro-batch, the final full weights, per step the chunks whose gradients were
    already gone after the last backward (updated in it), the disk bytes written and read, and
    the gradient norm (``last_grad_norm``)."""
    rank, world = rank_world()
    model = apply_gemini(build(), disk_config(directory, precision, update, device))
    opt = GeminiOptimizer(model, param_groups(model.module), lr=lr)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7) if schedule else None
    m = model.runtime.manager
    store = m.books.tiers[TierName.DISK].store
    per = batch // world
    losses: list[float] = []
    updated, written, read, norms = [], [], [], []
    data = batches(steps * accum, batch)
    for s in range(steps):
        store.drain()  # type: ignore[union-attr]
        stats = m.books.stats()
        before, faulted = stats.disk_io, stats.disk_faulted_bytes
        for i in range(accum):
            x, y = data[s * accum + i]
            x, y = x[rank * per : (rank + 1) * per], y[rank * per : (rank + 1) * per]
            loss = model(x, y) / accum
            if i < accum - 1 and declare:
                with opt.accumulating():
                    opt.backward(loss)
            else:
                opt.backward(loss)
            t = torch.tensor([loss.item() * accum])
            if world > 1:
                torch.distributed.all_reduce(t)
            losses.append(float(t) / world)
        trainable = [g for g in m.groups.values() if not g.param.frozen]
        updated.append(sum(g.grads is GradPhase.EMPTY for g in trainable))
        opt.step()
        norms.append(opt.last_grad_norm)
        opt.zero_grad()
        if sched is not None:
            sched.step()
        store.drain()  # type: ignore[union-attr]
        stats = m.books.stats()
        io = stats.disk_io - before
        written.append(io.bytes_written)
        read.append(io.bytes_read + stats.disk_faulted_bytes - faulted)
    weights = model.full_state_dict()
    m.close()
    return losses, weights, updated, written, read, norms
