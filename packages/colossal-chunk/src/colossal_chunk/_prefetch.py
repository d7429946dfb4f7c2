"""Copies issued ahead of use, off the critical path.

On CUDA a side stream carries the copy and an event orders the compute stream after it; on an
emulated accelerator a single worker thread runs the copy (torch releases the GIL while copying);
a copy the worker has not started when it is needed is cancelled there and made by the waiting
thread (which would otherwise sit idle until the worker is scheduled). A copy may name what
must happen first where it runs (``before``: a disk payload's read-ahead finished, [Note: disk
read-ahead and write-behind]), on whichever thread makes the copy.
The caller reserves the destination's bytes before issuing a copy, so prefetching never breaks a
tier's budget; it waits on the returned handle before it uses or frees either tensor.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import torch

__all__ = ["PendingCopy", "Prefetcher"]


class PendingCopy:
    """A copy in flight; ``wait()`` makes its result visible to the caller's stream or thread."""

    def __init__(
        self,
        dst: torch.Tensor,
        src: torch.Tensor,
        *,
        future: Future[object] | None = None,
        event: torch.cuda.Event | None = None,
        before: Callable[[], None] | None = None,
    ):
        self.dst, self.src = dst, src  # both kept alive until the copy is done
        self._future, self._event, self._before = future, event, before

    def wait(self) -> torch.Tensor:
        if self._future is not None:
            if self._future.cancel():  # the worker has not started it: copy here, not wait
                _copy(self.dst, self.src, self._before)  # for a thread the host has not scheduled
            else:
                self._future.result()
        if self._event is not None:
            torch.cuda.current_stream(self.dst.device).wait_event(self._event)
        return self.dst


class Prefetcher:
    """Issues ``dst.copy_(src)`` asynchronously: a CUDA side stream, or a worker thread."""

    def __init__(self, device: torch.device):
        self._cuda = device.type == "cuda"
        self._stream = torch.cuda.Stream(device) if self._cuda else None
        self._pool = None if self._cuda else ThreadPoolExecutor(1, "colossal-prefetch")

    def copy(
        self, dst: torch.Tensor, src: torch.Tensor, *, before: Callable[[], None] | None = None
    ) -> PendingCopy:
        """``dst.copy_(src)`` in flight, ``before()`` first (on CUDA: now, on this thread)."""
        if self._stream is not None:
            if before is not None:
                before()
            self._stream.wait_stream(torch.cuda.current_stream(dst.device))
            with torch.cuda.stream(self._stream):
                dst.copy_(src, non_blocking=True)
                event = torch.cuda.Event()
                event.record(self._stream)
            return PendingCopy(dst, src, event=event)
        assert self._pool is not None
        future = self._pool.submit(_copy, dst, src, before)
        return PendingCopy(dst, src, future=future, before=before)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)


def _copy(dst: torch.Tensor, src: torch.Tensor, before: Callable[[], None] | None) -> None:
    if before is not None:
        before()
    dst.copy_(src)
