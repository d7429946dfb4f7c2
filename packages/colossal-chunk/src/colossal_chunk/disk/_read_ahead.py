"""The disk tier's read-ahead window: the part of the host budget that disk pages read ahead of
their use may take.

[Note: read-ahead window] A read-ahead maps a disk payload's pages into this process before the
payload is used ([Note: disk read-ahead and write-behind]): they are host memory as much as a
host payload is, so the host budget H covers them. With a disk tier and a finite H, a window of
W bytes is reserved on the host tier when the manager is built (host payloads then fit in
H - W), and a read-ahead is issued only while the bytes read ahead and not yet unmapped, plus
its own, fit in W. A payload's pages leave the process when it is written behind (moved to disk,
or updated in place) or discarded (its chunk moved off disk); its bytes leave the window then.
So at every moment: host payloads + disk bytes read ahead <= H. Callers ask soonest-needed
first and stop at the first refusal, so the window slides along the step as chunks are used;
forward and backward read ahead within the step only (the next step's first chunks would hold
the window through the optimizer step, whose update sets then could not be read ahead). A
write-behind cancels (or waits for) its payload's read-ahead not yet done, which would map the
pages again after the unmap.

Not counted: pages a use maps on demand because its payload was not read ahead (the window was
full, or too small for it): one use at a time, at most one optimizer update set (fp32 values,
two Adam states, gradients) or one chunk copied to the compute tier. W is
``ChunkConfig.read_ahead_bytes``, by default ``min(_WINDOW_SHARDS fp32 shards, H // 4)`` in
whole shards (0: too small for one shard, nothing is read ahead). The window bounds RSS, not
step time: without one, lazy_rss's GPT 12 x 512 (H 64 MiB, B 32 MiB) peaked 30.8 MiB over
H + B (pages faulted in are in no window); its steps are faster: each shard of W is one more
chunk streaming through disk every step. Windows of 12, 24 and 32 MiB, paired in one process
with none (loaded machine), took 1.2, 1.35 and 1.31x as long. Without a host budget nothing
is reserved and nothing refused. The reservation is no payload: ``model_data_bytes`` leaves it
out, or a tracer that measures non-model bytes as live bytes minus model data would see W fewer
(none at all where W exceeds the step's activations and gradients, so the accelerator budget
kept no room for them and they went over it).
"""

from __future__ import annotations

from colossal_contracts import ConfigError

from .._chunk import Chunk
from .._config import ChunkConfig
from .._tier import UNLIMITED, Tier

__all__ = ["ReadAheadWindow", "window_bytes"]

_WINDOW_SHARDS = 4  # default window, in fp32 shards: one update set ahead of the one in use


def window_bytes(config: ChunkConfig, world_size: int) -> int:
    """W of [Note: read-ahead window] for ``config`` (``UNLIMITED`` without a host budget or
    without a disk tier: nothing to bound)."""
    if config.host_bytes is None or config.disk_bytes == 0:
        return UNLIMITED
    if config.read_ahead_bytes is not None:
        if config.read_ahead_bytes > config.host_bytes:
            raise ConfigError(
                f"read_ahead_bytes={config.read_ahead_bytes:,} is larger than the host budget "
                f"({config.host_bytes:,} bytes) it is taken from; lower it or raise host_bytes"
            )
        return config.read_ahead_bytes
    # an fp32 shard of the larger chunk size (rounded up, as chunks are)
    numel = max(config.chunk_numel, config.frozen_chunk_numel or 0)
    shard = -(-numel // world_size) * 4
    return min(_WINDOW_SHARDS, config.host_bytes // 4 // shard) * shard


class ReadAheadWindow:
    """The books of [Note: read-ahead window]: which chunks' disk shards are read ahead, and
    whether one more fits."""

    window_bytes: int  # W, reserved on the host tier (UNLIMITED: no host budget, no reservation)
    ahead_bytes: int  # disk bytes read ahead and still mapped into this process
    peak_bytes: int  # highest ``ahead_bytes`` since creation
    reserved_bytes: int  # of the host tier's used bytes, held for the window (no payload's)

    def __init__(self, host: Tier, window: int):
        self.window_bytes, self.ahead_bytes, self.peak_bytes = window, 0, 0
        self.reserved_bytes = window if 0 < window < UNLIMITED else 0
        if self.reserved_bytes:
            host.reserve(window, what="the disk tier's read-ahead window (read_ahead_bytes)")

    def admit(self, chunk: Chunk) -> bool:
        """Record a read-ahead of ``chunk``'s disk shard if it fits (True; also when it is read
        ahead already); False, changing nothing, when the window has no room for it."""
        if chunk.read_ahead_bytes:  # on the chunk: [Note: chunk residency]
            return True
        n = chunk.shard_bytes
        if self.ahead_bytes + n > self.window_bytes:
            return False
        chunk.read_ahead_bytes = n
        self.ahead_bytes += n
        self.peak_bytes = max(self.peak_bytes, self.ahead_bytes)
        return True

    def drop(self, chunk: Chunk) -> None:
        """``chunk``'s disk pages left this process (written behind or discarded)."""
        self.ahead_bytes -= chunk.read_ahead_bytes
        chunk.read_ahead_bytes = 0
