"""Joining the process group torchrun describes (through colossal-parallel), and asking about it."""

from __future__ import annotations

import os

import torch.distributed as dist

from colossal_parallel import launch_from_torch

from ._lifeline import die_with_launcher

__all__ = ["init_from_env", "rank_and_world"]


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
