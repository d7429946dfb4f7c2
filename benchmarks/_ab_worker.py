"""One rank of one side of ``bench_refactor_ab``: a long-lived process that imports Colossal from
the tree its ``PYTHONPATH`` names, builds a Gemini GPT on command and steps it on command.

Commands arrive as JSON lines on stdin; each gets one JSON line back on the protocol stream
(the process's original stdout; anything a library prints goes to stderr). Only APIs that exist
both before and after the refactor are used: ``apply_gemini``, ``GeminiConfig(precision=,
accelerator_bytes=)`` (and ``gather_ahead=`` from ``AB_GATHER_AHEAD`` in a tree that has it, so
that a later speed-up can be left out of the refactor's comparison), ``GeminiOptimizer.from_torch``, ``GeminiModule.memory_stats()`` and
``colossal_models.GPT``/``GPTConfig.preset``.

    {"op": "build", "preset": "tiny", "budget": null}  -> {"num_chunks": int}
    {"op": "step", "i": 3, "batch": 8, "seq": 64}       -> {"s": seconds, "loss": float}
    {"op": "stats"}                                     -> {"peak": bytes, "moved": bytes}
    {"op": "quit"}

Environment: ``AB_RANK``, ``AB_WORLD`` and ``AB_PORT`` (a gloo world over loopback when
``AB_WORLD`` > 1; one rank runs without torch.distributed, as ``bench_overhead`` does).
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import sys
import time
from typing import Any

import torch
import torch.distributed as dist

LR = 1e-3


class _Side:
    """The model and optimizer of one case on this rank."""

    def __init__(self, preset: str, budget: int | None):
        from colossal_models import GPT, GPTConfig
        from colossal_zero import GeminiConfig, GeminiOptimizer, apply_gemini

        torch.manual_seed(0)
        extra: dict[str, Any] = {}
        ahead = os.environ.get("AB_GATHER_AHEAD")  # a tree whose Gemini has the option
        if ahead and "gather_ahead" in {f.name for f in dataclasses.fields(GeminiConfig)}:
            extra["gather_ahead"] = int(ahead)
        cfg = GeminiConfig(precision="fp32", accelerator_bytes=budget, **extra)
        self.model = apply_gemini(GPT(GPTConfig.preset(preset)), cfg)
        self.opt = GeminiOptimizer.from_torch(
            self.model, torch.optim.AdamW(self.model.module.parameters(), lr=LR)
        )

    def step(self, i: int, batch: int, seq: int) -> tuple[float, float]:
        """Seconds of step ``i`` (between barriers on more than one rank) and this rank's loss."""
        g = torch.Generator().manual_seed(1000 + i)
        x, y = torch.randint(0, 256, (2, batch, seq), generator=g)
        world = dist.get_world_size() if dist.is_initialized() else 1
        rank = dist.get_rank() if dist.is_initialized() else 0
        per = batch // world
        x, y = x[rank * per : (rank + 1) * per], y[rank * per : (rank + 1) * per]
        if world > 1:
            dist.barrier()
        t0 = time.perf_counter()
        loss = self.model(x, y)
        self.opt.backward(loss)
        self.opt.step()
        self.opt.zero_grad()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        if world > 1:
            dist.barrier()
        return time.perf_counter() - t0, float(loss.detach())


def main() -> int:
    proto = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    sys.stdout = sys.stderr  # library prints must not reach the protocol stream
    world = int(os.environ.get("AB_WORLD", "1"))
    if world > 1:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{os.environ['AB_PORT']}",
            rank=int(os.environ["AB_RANK"]),
            world_size=world,
        )
    import colossal_chunk
    import colossal_models
    import colossal_zero

    def reply(obj: dict[str, Any]) -> None:
        proto.write(json.dumps(obj) + "\n")

    reply({"files": [m.__file__ for m in (colossal_chunk, colossal_zero, colossal_models)]})
    side: _Side | None = None
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        if op == "build":
            side = None  # the previous case's chunks go before the next one's are made
            gc.collect()
            side = _Side(cmd["preset"], cmd["budget"])
            reply({"num_chunks": side.model.memory_stats().num_chunks})
        elif op == "step":
            assert side is not None, "step before build"
            s, loss = side.step(cmd["i"], cmd["batch"], cmd["seq"])
            reply({"s": s, "loss": loss})
        elif op == "stats":
            assert side is not None, "stats before build"
            st = side.model.memory_stats()
            reply({"peak": st.tiers["accelerator"].peak_bytes, "moved": st.bytes_moved})
        elif op == "quit":
            break
        else:
            raise ValueError(f"unknown command {op!r}")
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
