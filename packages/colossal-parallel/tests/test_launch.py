"""launch_from_torch under torchrun: one node with two workers, and two "nodes" on loopback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from colossal_contracts import DistributedError
from colossal_parallel import launch_from_torch
from colossal_testing import free_port

SCRIPT = Path(__file__).parent / "_launch_script_parallel.py"


def _torchrun(args: list[str], out: Path) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", *args, str(SCRIPT), str(out)]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _wait(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        try:
            output, _ = p.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        assert p.returncode == 0, output.decode(errors="replace")[-3000:]


def _results(out: Path, n: int) -> list[dict]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(n)]


def _check(results: list[dict], n: int, local_ranks: list[int]) -> None:
    for r, res in enumerate(results):
        assert res["rank"] == r and res["world_size"] == n
        assert res["local_rank"] == local_ranks[r]
        assert res["backend"] == "gloo"
        assert res["sum"] == n * (n + 1) / 2
        assert res["counted"] == 4  # one fp32 element all-reduced
        assert res["ranks"] == list(range(n))
        assert res["seed"] == 7 + r
        torch.manual_seed(7 + r)
        assert res["draw"] == torch.rand(1).item()


def test_single_node_two_workers(tmp_path):
    port = free_port()
    args = [
        "--nnodes",
        "1",
        "--nproc-per-node",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(port),
    ]
    _wait([_torchrun(args, tmp_path)])
    _check(_results(tmp_path, 2), 2, [0, 1])


def test_two_nodes_on_loopback(tmp_path):
    port = free_port()
    procs = [
        _torchrun(
            [
                "--nnodes",
                "2",
                "--nproc-per-node",
                "1",
                "--node-rank",
                str(node),
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                str(port),
            ],
            tmp_path,
        )
        for node in (0, 1)
    ]
    _wait(procs)
    _check(_results(tmp_path, 2), 2, [0, 0])


def test_missing_environment_is_a_clear_error(monkeypatch):
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(DistributedError, match="LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT"):
        launch_from_torch()


def test_inconsistent_environment(monkeypatch):
    env = {
        "RANK": "3",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "1",
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(DistributedError, match="RANK=3 is not below WORLD_SIZE=2"):
        launch_from_torch()
