"""Where a chunk's tensors sit and which state each is in: the layout half of ``Chunk``.

A chunk of ``capacity`` elements holds its tensors back to back from element 0 and is split into
``world_size`` equal shards ([Note: chunk storage] in ``_chunk.py``); each tensor's record keeps
its offset and its state, and the chunk counts its tensors per state ([Note: states by number]
in ``_records.py``), so a state check is a counter read. ``Chunk`` adds the storage and the
collectives on top.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.distributed as dist

from colossal_contracts import ConfigError, TensorState, check_transition

from ._records import COMPUTE, FREE, HOLD, LEGAL, STATES, TensorRecord, code_of

__all__ = ["ChunkLayout"]


class ChunkLayout:
    """The tensors of one chunk: their records in order of offset, this rank's part of each,
    and how many are in each state. Transitions go through ``set_state`` (or ``_set``), which
    checks them against ``LEGAL`` and keeps the counters."""

    chunk_id: int
    kind: str  # "param" for parameter chunks; parallel chunks: "grad", "master", ...
    frozen: bool  # only read ([Note: frozen chunks] in _register.py): no twin, no write-back
    dtype: torch.dtype
    capacity: int  # elements in the full chunk, a multiple of world_size
    world_size: int
    rank: int
    group: dist.ProcessGroup | None
    records: dict[str, TensorRecord]  # in order of offset
    used: int  # elements filled by tensors; the rest is padding
    _counts: list[int]  # tensors per state code, kept by _set ([Note: states by number])
    _spans: dict[str, tuple[int, int, int, int] | None]  # name -> its part of this rank's shard
    # (start and end in the shard, start and end in the tensor's elements); None: no part

    def __init__(
        self,
        chunk_id: int,
        capacity: int,
        dtype: torch.dtype,
        *,
        kind: str = "param",
        group: dist.ProcessGroup | None = None,
        frozen: bool = False,
    ):
        self.world_size = dist.get_world_size(group) if group is not None else 1
        self.rank = dist.get_rank(group) if group is not None else 0
        if capacity <= 0 or capacity % self.world_size:
            raise ConfigError(
                f"chunk capacity {capacity} must be a positive multiple of the world size "
                f"{self.world_size}; round chunk_numel up"
            )
        self.chunk_id, self.kind, self.dtype, self.capacity = chunk_id, kind, dtype, capacity
        self.group, self.frozen = group, frozen
        self.records, self.used = {}, 0
        self._counts = [0] * len(STATES)
        self._spans = {}

    # ----- layout -------------------------------------------------------------------------------
    @property
    def shard_numel(self) -> int:
        return self.capacity // self.world_size

    @property
    def element_size(self) -> int:
        return self.dtype.itemsize

    @property
    def shard_bytes(self) -> int:
        """Bytes of the payload at rest (this rank's shard)."""
        return self.shard_numel * self.element_size

    @property
    def full_bytes(self) -> int:
        """Bytes of the gathered buffer."""
        return self.capacity * self.element_size

    @property
    def padding(self) -> int:
        """Elements of the chunk no tensor uses."""
        return self.capacity - self.used

    def fits(self, numel: int) -> bool:
        return self.used + numel <= self.capacity

    def add(self, name: str, shape: torch.Size | tuple[int, ...]) -> TensorRecord:
        """Reserve room for a tensor at the end of the chunk (layout only; no data is copied)."""
        shape = torch.Size(shape)
        numel = shape.numel()
        if name in self.records:
            raise ConfigError(f"tensor {name!r} is already in chunk {self.chunk_id}")
        if not self.fits(numel):
            raise ConfigError(
                f"tensor {name!r} ({numel:,} elements) does not fit in chunk {self.chunk_id} "
                f"({self.capacity - self.used:,} of {self.capacity:,} free); raise chunk_numel to "
                f"at least {numel:,}"
            )
        first = TensorState.HOLD if self.world_size == 1 else TensorState.FREE
        rec = TensorRecord(name, self.used, numel, shape, first)
        self.records[name] = rec
        self._counts[rec.code] += 1
        lo = self.rank * self.shard_numel
        a, b = max(lo, self.used), min(lo + self.shard_numel, self.used + numel)
        self._spans[name] = (a - lo, b - lo, a - self.used, b - self.used) if a < b else None
        self.used += numel
        return rec

    # ----- states -------------------------------------------------------------------------------
    def state(self, name: str) -> TensorState:
        return self.records[name].state

    def set_state(self, name: str, new: TensorState) -> None:
        """Move tensor ``name`` to ``new`` through ``check_transition`` (raises when illegal)."""
        self._set(self.records[name], code_of(new))

    def _set(self, rec: TensorRecord, new: int) -> None:
        """Move ``rec`` to the state of code ``new`` ([Note: states by number])."""
        old = rec.code
        if old == new:
            return
        if not LEGAL[old][new]:  # raises, naming the tensor
            what = f"tensor {rec.name!r} of chunk {self.chunk_id}"
            check_transition(STATES[old], STATES[new], what=what)
        rec.code = new
        counts = self._counts
        counts[old] -= 1
        counts[new] += 1

    def count(self, state: TensorState) -> int:
        """Tensors in ``state`` (a counter read)."""
        return self._counts[code_of(state)]

    def all_in(self, state: TensorState) -> bool:
        """True when every tensor of the chunk is in ``state``."""
        return self._counts[code_of(state)] == len(self.records)

    @property
    def pinned(self) -> bool:
        """True while any tensor is in COMPUTE: the chunk may not move (ChunkInfo.pinned)."""
        return self._counts[COMPUTE] > 0

    @property
    def movable(self) -> bool:
        """True when the chunk may leave the compute tier: every tensor is HOLD or FREE."""
        c = self._counts
        return c[HOLD] + c[FREE] == len(self.records)

    def __iter__(self) -> Iterator[TensorRecord]:
        return iter(self.records.values())
