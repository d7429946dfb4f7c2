"""A long-lived group of processes joined by torch.distributed, that runs many checks.

Spawning a process and importing torch costs seconds; with eight ranks on two cores a fresh world
per test would dominate the suite. A ``World`` starts its ranks once and then runs any number of
module-level functions on all of them, returning each rank's result.

[Note: forked ranks] Ranks are forked from multiprocessing's fork server, which imports the
``preload`` modules once (by default the parent's main script, torch, torch.distributed and
torch._dynamo, which torch's optimizers import on their first step: about a second per rank);
each rank then starts with them imported instead of importing torch itself, and leaves by
``os._exit`` instead of finalising a torch interpreter. Nothing runs in the server but those
imports (no torch op, no thread pool, no CUDA), so forking it is safe. The server is one per
process: the first world started fixes its preload list. Ranks take the parent's ``sys.path``
and environment as they start (as spawned ones would), not the server's.

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
import sys
import time
import traceback
from collections.abc import Callable
from multiprocessing import forkserver
from typing import Any

__all__ = ["RankError", "World", "free_port"]


class RankError(RuntimeError):
    """A function failed (or timed out) on at least one rank; the message holds the traceback."""


def free_port() -> int:
    """A TCP port on loopback that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


PRELOAD = ("__main__", "torch", "torch.distributed", "torch._dynamo")


def _fork_context(preload: tuple[str, ...]) -> Any:
    """The fork-server context; its server imports ``preload`` first ([Note: forked ranks])."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(preload))
    unset = "OMP_NUM_THREADS" not in os.environ
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # read by the server's torch import
    try:
        forkserver.ensure_running()
    finally:
        if unset:
            del os.environ["OMP_NUM_THREADS"]
    return ctx


def _worker(
    rank: int,
    world_size: int,
    port: int,
    backend: str,
    path: list[str],
    env: dict[str, str],
    tasks: Any,
    results: Any,
) -> None:
    sys.path[:] = path
    os.environ.clear()
    os.environ.update(env)
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
    module-level function and its arguments and result picklable. Ranks are forked from a server
    that imported ``preload`` (see [Note: forked ranks]).
    """

    def __init__(
        self,
        world_size: int,
        *,
        backend: str = "gloo",
        timeout_s: float = 300.0,
        preload: tuple[str, ...] = PRELOAD,
    ):
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        self.world_size = world_size
        self.backend = backend
        self.timeout_s = timeout_s
        self.preload = preload
        self._procs: list[Any] = []
        self._tasks: list[Any] = []
        self._results: Any = None

    def _start(self) -> None:
        ctx = _fork_context(self.preload)
        port = free_port()
        head = (self.world_size, port, self.backend, list(sys.path), dict(os.environ))
        self._results = ctx.Queue()
        self._tasks = [ctx.Queue() for _ in range(self.world_size)]
        self._procs = [
            ctx.Process(
                target=_worker,
                args=(r, *head, self._tasks[r], self._results),
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
            self._stop(grace_s=0.0)  # the others may be blocked in a collective: no waiting
            raise RankError(
                f"{fn.__qualname__} failed on a {self.world_size}-rank world:\n" + "\n".join(errors)
            )
        return [out[r] for r in range(self.world_size)]

    def close(self) -> None:
        """Stop every rank (politely, then by force): at most 5 s for all of them together."""
        self._stop(grace_s=5.0)

    def _stop(self, grace_s: float) -> None:
        for q in self._tasks:
            with contextlib.suppress(Exception):
                q.put(None)
        deadline = time.monotonic() + grace_s
        for p in self._procs:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
        for p in self._procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        self._procs, self._tasks, self._results = [], [], None

    def __enter__(self) -> World:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
