"""Joining the process group torchrun describes, and leaving it."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from colossal_contracts import DistributedError

__all__ = ["init_from_env", "is_main_rank", "rank_and_world"]


def init_from_env() -> bool:
    """Join the group described by torchrun's environment; False when not launched by torchrun.

    gloo on CPU, NCCL when CUDA is available. Idempotent.
    """
    if "WORLD_SIZE" not in os.environ or int(os.environ["WORLD_SIZE"]) <= 1:
        return False
    if dist.is_initialized():
        return True
    missing = [k for k in ("RANK", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise DistributedError(
            f"WORLD_SIZE is set but {', '.join(missing)} is not; launch with `colossal run` or torchrun"
        )
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend)
    return True


def rank_and_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def is_main_rank() -> bool:
    return rank_and_world()[0] == 0
