"""A prefetch copy's ``before`` (a disk read-ahead finished where the copy runs) runs once,
before the copy, on the worker or on the waiting thread that made the copy itself."""

import threading

import torch

from colossal_chunk._prefetch import Prefetcher


def _copy_with_before(p: Prefetcher, busy: threading.Event | None) -> list[tuple[str, float]]:
    src, dst = torch.full((1024,), 7.0), torch.zeros(1024)
    seen: list[tuple[str, float]] = []
    if busy is not None:  # the worker is busy: the waiting thread makes the copy
        p._pool.submit(busy.wait)  # type: ignore[union-attr]
    pending = p.copy(
        dst, src, before=lambda: seen.append((threading.current_thread().name, dst[0].item()))
    )
    if busy is None:
        pending._future.result()  # type: ignore[union-attr]  # the worker made it
    got = pending.wait()
    if busy is not None:
        busy.set()
    assert torch.equal(got, src)
    return seen


def test_before_runs_once_ahead_of_the_copy_on_whichever_thread_copies():
    p = Prefetcher(torch.device("cpu"))
    [(worker, value)] = _copy_with_before(p, None)
    assert value == 0.0 and worker.startswith("colossal-prefetch")  # before the copy
    [(waiter, value)] = _copy_with_before(p, threading.Event())
    assert value == 0.0 and waiter == threading.current_thread().name != worker
    p.close()
