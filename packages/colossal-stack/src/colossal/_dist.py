"""Joining the process group torchrun describes (through colossal-parallel), and asking about it."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from colossal_parallel import launch_from_torch

from ._lifeline import die_with_launcher

__all__ = ["init_from_env", "init_single_process", "rank_and_world"]


def init_from_env() -> bool:
    """Join torchrun's group with ``launch_from_torch``; False when not launched with 2+ ranks.

    Idempotent: a group that already exists is kept.
    """
    die_with_launcher()  # a rank of `colossal run` dies with it ([Note: parent-death signal])
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return False
    if not dist.is_initialized():
        launch_from_torch()
    return True


def rank_and_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def init_single_process() -> bool:
    """A one-rank group in this process when none exists (no torchrun, no port: an in-memory
    store), so that a mesh-based plugin runs on one process as the others do; True when it
    created one (the caller destroys it with ``dist.destroy_process_group()`` when done)."""
    if not dist.is_available():
        return False
    if dist.is_initialized():
        return False
    backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return True
