"""Handles of a chunk's collectives in flight ([Note: one collective in flight] in ``_chunk.py``)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from types import TracebackType
from typing import TYPE_CHECKING, Protocol

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from ._chunk import Chunk

__all__ = ["GatherBatch", "InFlightCount", "PendingReduce"]


class _Work(Protocol):
    """What an async torch.distributed collective returns (``dist.Work``)."""

    def wait(self) -> object: ...


class PendingReduce:
    """A reduce-scatter in flight (``Chunk.start_reduce_scatter``); ``wait()`` finishes it once
    and returns the dropped gathered buffer (None with one rank)."""

    def __init__(
        self,
        chunk: Chunk,
        out: torch.Tensor | None,
        work: _Work | None,
        *,
        average: bool,
        accumulate: bool,
        into: Chunk | None = None,
    ):
        self.chunk, self._out, self._work = chunk, out, work
        self._average, self._accumulate = average, accumulate
        self.into = into  # the chunk whose shard takes the result (None: ``chunk``'s own)
        self.done = out is None

    def wait(self) -> torch.Tensor | None:
        work, out = self._work, self._out
        if self.done or work is None or out is None:  # (one rank: neither; done: out is None)
            return None
        work.wait()
        self.done = True
        if self.chunk._inflight is self:
            self.chunk._inflight = None
        self._out = None
        return self.chunk._finish_reduce(
            out,
            average=self._average,
            accumulate=self._accumulate,
            into=self.into,
        )


class _PendingGather:
    """An all-gather in flight (``Chunk.start_gather``), alone or in a ``GatherBatch``."""

    def __init__(self, work: _Work):
        self._work = work

    def wait(self) -> None:
        self._work.wait()


class GatherBatch:
    """All-gathers of several chunks started as one collective ([Note: coalesced gathers] in
    ``_collectives.py``). Inside ``with batch:`` each ``Chunk.start_gather(full, batch=batch)``
    is recorded; leaving the block starts them all as one coalesced collective (torch's
    coalescing manager: one NCCL group, one gloo all-gather over the concatenated shards), and
    the first ``wait()`` of any of its chunks finishes it for all of them. Every rank must record
    the same chunks in the same order, as for any collective."""

    def __init__(self, group: dist.ProcessGroup | None) -> None:
        self._group = group
        self._work: _Work | None = None
        self._ctx: AbstractContextManager[_Work] | None = None

    def __enter__(self) -> GatherBatch:
        self._ctx = dist._coalescing_manager(self._group, async_ops=True)
        self._work = self._ctx.__enter__()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        ctx, self._ctx = self._ctx, None
        if ctx is not None:
            ctx.__exit__(kind, exc, tb)

    def wait(self) -> None:
        work, self._work = self._work, None
        if work is not None:
            work.wait()


class InFlightCount:
    """How many of one manager's chunks have a collective in flight now, and the most at once.

    [Note: collectives in flight] The manager starts all-gathers ahead of use (``gather_ahead``)
    and reduce-scatters without waiting (``reduce(async_op=True)``), and finishes a chunk's
    collective when the chunk is next accessed, moved or re-packed, or in ``settle()``, which a
    runtime calls before an optimizer reads shards. Finishing re-points the parameter views; a
    finished reduce-scatter also frees its gathered buffer on the compute tier. Whether a chunk
    has one in flight is its ``Lifecycle`` (GATHERING, REDUCING); this counter is kept by the
    chunks' lifecycle moves (whoever finishes the collective), so "is any in flight" costs no
    scan on the hot path.
    """

    now: int  # chunks with a collective in flight
    most: int  # the most at once since creation

    def __init__(self) -> None:
        self.now = self.most = 0

    def __len__(self) -> int:
        return self.now

    def moved(self, *, started: bool) -> None:
        """A chunk's collective started (``started``) or finished."""
        if started:
            self.now += 1
            self.most = max(self.most, self.now)
        else:
            self.now -= 1
