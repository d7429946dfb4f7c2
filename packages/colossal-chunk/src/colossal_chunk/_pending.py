"""Handles of a chunk's collectives in flight ([Note: one collective in flight] in ``_chunk.py``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from ._chunk import Chunk

__all__ = ["PendingReduce"]


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
    """An all-gather in flight (``Chunk.start_gather``)."""

    def __init__(self, work: _Work):
        self._work = work

    def wait(self) -> None:
        self._work.wait()


class InFlight:
    """The chunks of one manager with a collective in flight, and the books when one finishes.

    [Note: collectives in flight] The manager starts all-gathers ahead of use (``gather_ahead``)
    and reduce-scatters without waiting (``reduce(async_op=True)``), and finishes a chunk's
    collective when the chunk is next accessed, moved or re-packed, or in ``settle()``, which a
    runtime calls before an optimizer reads shards. Finishing re-points the parameter views; a
    finished reduce-scatter also frees its gathered buffer on the compute tier.
    """

    chunks: dict[int, Chunk]  # chunk id -> chunk with a collective started here
    most: int  # the most collectives in flight at once since the counter was reset

    def __init__(
        self,
        drop_gathered: Callable[[Chunk, torch.Tensor | None], None],
        rebind: Callable[[Chunk], None],
    ) -> None:
        self._drop, self._rebind = drop_gathered, rebind
        self.chunks, self.most = {}, 0

    def __len__(self) -> int:
        return len(self.chunks)

    def add(self, chunk: Chunk) -> None:
        if chunk.in_flight:
            self.chunks[chunk.chunk_id] = chunk
            self.most = max(self.most, len(self.chunks))

    def finish(self, chunk: Chunk) -> None:
        """Finish ``chunk``'s collective if one was started here (it may have finished already:
        ``Chunk.release`` finishes one, and its caller kept the books)."""
        if self.chunks.pop(chunk.chunk_id, None) is not None:
            self._drop(chunk, chunk.wait())
            self._rebind(chunk)

    def finish_all(self) -> None:
        for c in list(self.chunks.values()):
            self.finish(c)
