"""Run under torchrun by test_launch.py: launch, build a mesh, all-reduce, write a JSON result."""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist

from colossal_parallel import MeshConfig, ProcessMesh, launch_from_torch


def main(out_dir: str) -> None:
    info = launch_from_torch(seed=7, seed_per_rank=True)
    mesh = ProcessMesh(MeshConfig(tp=info.world_size))
    total = mesh.comm.all_reduce(torch.tensor([float(info.rank + 1)]), "tp")
    result = {
        "rank": info.rank,
        "local_rank": info.local_rank,
        "world_size": info.world_size,
        "backend": info.backend,
        "seed": info.seed,
        "draw": torch.rand(1).item(),  # first draw after seeding
        "sum": total.item(),
        "counted": mesh.comm.counter.bytes(),
        "ranks": mesh.ranks("tp"),
    }
    with open(os.path.join(out_dir, f"rank{info.rank}.json"), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
