"""Prefetch copies on an emulated accelerator: a copy the worker thread has not started when it
is needed is made by the waiting thread, not waited for; one the worker made is waited for."""

import threading

import torch

from colossal_chunk._prefetch import Prefetcher


def _wait_in_thread(pending) -> tuple[threading.Thread, list[torch.Tensor]]:  # type: ignore[no-untyped-def]
    out: list[torch.Tensor] = []
    t = threading.Thread(target=lambda: out.append(pending.wait()), daemon=True)
    t.start()
    return t, out


def test_a_copy_the_worker_has_not_started_is_made_by_the_waiting_thread():
    pf = Prefetcher(torch.device("cpu"))
    gate = threading.Event()
    pf._pool.submit(gate.wait)  # the only worker is busy until the gate opens
    src, dst = torch.arange(4096.0), torch.empty(4096)
    t, out = _wait_in_thread(pf.copy(dst, src))
    t.join(timeout=60)  # waiting for the worker would block until the gate opens: never
    done = not t.is_alive()
    gate.set()
    pf.close()
    assert done and out[0] is dst and torch.equal(dst, src)


def test_a_copy_the_worker_made_is_waited_for():
    pf = Prefetcher(torch.device("cpu"))
    src, dst = torch.arange(4096.0), torch.empty(4096)
    pending = pf.copy(dst, src)
    pending._future.result()  # the worker made it
    assert pending.wait() is dst and torch.equal(dst, src)
    pf.close()
