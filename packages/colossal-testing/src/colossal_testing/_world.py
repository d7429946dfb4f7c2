"""A long-lived group of processes joined by torch.distributed, that runs many checks.

Spawning a process and importing torch costs seconds; with eight ranks on two cores a fresh world
per test would dominate the suite. A ``World`` starts its ranks once and then runs any number of
module-level functions on all of them, returning each rank's result.

[Note: world failure] If a function raises on any rank, the other ranks may be blocked in a
collective that will never complete. The world then reports the error, tears itself down, and the
next ``run`` starts a fresh one, so one failing check never hangs the ones after it.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import queue
import socket
import traceback
from collections.abc import Callable
from typing import Any

__all__ = ["RankError", "World", "free_port"]


class RankError(RuntimeError):
    """A function failed (or timed out) on at least one rank; the message holds the traceback."""


def free_port() -> int:
    """A TCP port on loopback that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(rank: int, world_size: int, port: int, backend: str, tasks: Any, results: Any) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size
    )
    try:
        while True:
            task = tasks.get()
            if task is None:
                break
            fn, args, kwargs = task
            try:
                results.put((rank, True, fn(*args, **kwargs)))
            except BaseException:
                results.put((rank, False, traceback.format_exc()))
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


class World:
    """``world_size`` ranks on gloo over loopback, started lazily and reused.

    ``run(fn, *args)`` calls ``fn(*args)`` on every rank (``torch.distributed`` is initialised;
    ``dist.get_rank()`` tells the rank) and returns the results in rank order. ``fn`` must be a
    module-level function and its arguments and result picklable.
    """

    def __init__(self, world_size: int, *, backend: str = "gloo", timeout_s: float = 300.0):
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        self.world_size = world_size
        self.backend = backend
        self.timeout_s = timeout_s
        self._procs: list[Any] = []
        self._tasks: list[Any] = []
        self._results: Any = None

    def _start(self) -> None:
        ctx = mp.get_context("spawn")
        port = free_port()
        self._results = ctx.Queue()
        self._tasks = [ctx.Queue() for _ in range(self.world_size)]
        self._procs = [
            ctx.Process(
                target=_worker,
                args=(r, self.world_size, port, self.backend, self._tasks[r], self._results),
                daemon=True,
            )
            for r in range(self.world_size)
        ]
        for p in self._procs:
            p.start()

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Any]:
        """Run ``fn`` on every rank; raise ``RankError`` if any rank fails (see [Note: world failure])."""
        if not self._procs:
            self._start()
        for q in self._tasks:
            q.put((fn, args, kwargs))
        out: dict[int, Any] = {}
        errors: list[str] = []
        while len(out) + len(errors) < self.world_size:
            try:
                rank, ok, value = self._results.get(timeout=self.timeout_s)
            except queue.Empty:
                dead = [i for i, p in enumerate(self._procs) if not p.is_alive()]
                errors.append(f"timed out after {self.timeout_s:.0f}s; dead ranks: {dead}")
                break
            if ok:
                out[rank] = value
            else:
                errors.append(f"rank {rank}:\n{value}")
                break
        if errors:
            self.close()
            raise RankError(
                f"{fn.__qualname__} failed on a {self.world_size}-rank world:\n" + "\n".join(errors)
            )
        return [out[r] for r in range(self.world_size)]

    def close(self) -> None:
        """Stop every rank (politely, then by force)."""
        for q in self._tasks:
            with contextlib.suppress(Exception):
                q.put(None)
        for p in self._procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        self._procs, self._tasks, self._results = [], [], None

    def __enter__(self) -> World:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
