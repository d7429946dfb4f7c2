"""``launch_from_torch``: join the process group that torchrun describes in the environment.

torchrun (``python -m torch.distributed.run``) sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT for every worker, on one node or many (multi-node is torchrun's rendezvous). This
module reads them, picks NCCL when CUDA is present and gloo otherwise, and seeds the generators.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from colossal_contracts import ConfigError, DistributedError

__all__ = ["LaunchInfo", "launch_from_torch", "seed_everything"]

_REQUIRED = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class LaunchInfo:
    """What ``launch_from_torch`` set up.

    Attributes:
        rank: global rank.
        local_rank: rank on this node (the CUDA device index when there is one).
        world_size: number of ranks in all.
        backend: "nccl" or "gloo".
        device: the device this rank computes on.
        seed: the seed this rank's generators were given.
    """

    rank: int
    local_rank: int
    world_size: int
    backend: str
    device: torch.device
    seed: int


def seed_everything(seed: int) -> None:
    """Seed Python's, torch's (CPU and every CUDA device) and, when installed, numpy's generators."""
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np
    except ImportError:  # numpy is optional
        return
    np.random.seed(seed % 2**32)


def _read_env() -> dict[str, str]:
    missing = [k for k in _REQUIRED if k not in os.environ]
    if missing:
        raise DistributedError(
            f"launch_from_torch() needs the torchrun environment, but {', '.join(missing)} "
            "is not set; start the script with `torchrun --nproc-per-node N script.py` (or "
            "`python -m torch.distributed.run ...`), or set those variables yourself"
        )
    env = {k: os.environ[k] for k in _REQUIRED}
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT"):
        if not env[k].isdigit():
            raise DistributedError(
                f"environment variable {k} must be a non-negative int, got {env[k]!r}"
            )
    if int(env["RANK"]) >= int(env["WORLD_SIZE"]):
        raise DistributedError(
            f"RANK={env['RANK']} is not below WORLD_SIZE={env['WORLD_SIZE']}; check the launcher"
        )
    return env


def launch_from_torch(
    *,
    seed: int = 1024,
    seed_per_rank: bool = False,
    backend: str | None = None,
    timeout_s: float = 1800.0,
) -> LaunchInfo:
    """Initialise torch.distributed from torchrun's environment and seed this rank.

    ``backend`` defaults to "nccl" when CUDA is available (and binds the rank to
    ``cuda:LOCAL_RANK``) and "gloo" otherwise. Every rank is seeded with ``seed`` so that modules
    built on all ranks start identical (tensor-parallel layers are cut from such modules); with
    ``seed_per_rank`` rank r gets ``seed + r`` instead (for data that must differ per rank).
    Raises ``DistributedError`` when the environment is missing or a group already exists.
    """
    if not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"seed must be a non-negative int, got {seed!r}")
    env = _read_env()
    if dist.is_initialized():
        raise DistributedError(
            "torch.distributed is already initialised in this process; call launch_from_torch() "
            "once, before building any ProcessMesh"
        )
    rank, local_rank, world_size = int(env["RANK"]), int(env["LOCAL_RANK"]), int(env["WORLD_SIZE"])
    cuda = torch.cuda.is_available()
    if backend is None:
        backend = "nccl" if cuda else "gloo"
    if backend == "nccl" and not cuda:
        raise ConfigError("backend='nccl' needs CUDA, which is not available; use backend='gloo'")
    if cuda and backend == "nccl":
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group(
        backend,
        init_method="env://",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
    )
    rank_seed = seed + rank if seed_per_rank else seed
    seed_everything(rank_seed)
    return LaunchInfo(rank, local_rank, world_size, backend, device, rank_seed)
