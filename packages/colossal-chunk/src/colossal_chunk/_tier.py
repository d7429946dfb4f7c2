"""Memory tiers: a name, a torch device and a byte capacity, with the accounting that enforces it.

[Note: tier accounting] The owner (the chunk manager) calls ``reserve`` before it allocates a
payload on a tier and ``free`` after it drops one, so ``used_bytes <= capacity_bytes`` holds at every
moment, also on an emulated accelerator where nothing else would stop an overrun; the one exception
is a loan (``lend``) to the warmup step ([Note: warmup loan] in ``_room.py``), which lets
``used_bytes`` exceed the capacity by the loan until ``end_loan``.

[Note: disk fault-ins] A disk payload is read into memory by a read-ahead before its use, or,
when none was issued since it was last written (the read-ahead window was full, or too small
for it: [Note: read-ahead window]), by the use itself, a page fault per page. The store counts
what its read-aheads read (``DiskIOStats.bytes_read``: also one its user maps itself,
``finish_read``); the tier counts the rest, at each use the owner reports (``used``: a copy off
the payload, or a use in place): ``faulted_bytes``. Not in either: a read-ahead not taken up by
the reader when its payload was used without a ``finish_read`` first (the uses reported only
through ``ChunkManager.written``: a checkpoint's save, a gradient norm taken up front) and
dropped by the payload's write-behind or discard after (the use faulted the pages in, the
store read nothing).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import torch

from colossal_contracts import CapacityError, ConfigError, InternalError, TierName

from ._config import ChunkConfig
from ._host_memory import host_empty
from .disk._store import DiskStore

__all__ = ["UNLIMITED", "Tier", "build_tiers"]

ACC, HOST, DISK = TierName.ACCELERATOR, TierName.HOST, TierName.DISK

UNLIMITED = sys.maxsize
"""Capacity of a tier without a budget."""


@dataclass(eq=False)
class Tier:
    """One place chunk payloads can live; satisfies ``colossal_contracts.MemoryTier``.

    Attributes:
        name: accelerator, host or disk.
        device: where payloads are allocated (``cpu`` for host, disk and an emulated accelerator).
        capacity_bytes: the most payload bytes it may hold (``UNLIMITED`` for no budget).
        emulated: True for an accelerator emulated on the CPU (figures must say so).
        pin_memory: allocate pinned host memory (only where CUDA exists).
        store: the files behind the disk tier; None for the others.
    """

    name: TierName
    device: torch.device
    capacity_bytes: int = UNLIMITED
    emulated: bool = False
    pin_memory: bool = False
    store: DiskStore | None = None
    _used: int = field(default=0, repr=False)
    _peak: int = field(default=0, repr=False)
    _faulted: int = field(default=0, repr=False)
    _lent: int = field(default=0, repr=False)

    @property
    def used_bytes(self) -> int:
        """Bytes of payloads held now."""
        return self._used

    @property
    def peak_bytes(self) -> int:
        """Highest ``used_bytes`` since creation or the last ``reset_peak``."""
        return self._peak

    @property
    def free_bytes(self) -> int:
        return self.capacity_bytes - self._used

    @property
    def lent_bytes(self) -> int:
        """Bytes this tier may hold beyond its capacity now ([Note: warmup loan]); 0 normally."""
        return self._lent

    def lend(self, nbytes: int) -> None:
        """Let ``used_bytes`` exceed the capacity by up to ``nbytes`` until ``end_loan``."""
        self._lent = max(self._lent, nbytes)

    def end_loan(self) -> None:
        """Back to ``used_bytes <= capacity_bytes`` for every new payload (held ones stay until
        their owner moves them off)."""
        self._lent = 0

    def reserve(self, nbytes: int, *, what: str) -> None:
        """Count ``nbytes`` more as used; raise ``CapacityError`` (changing nothing) if they do not fit."""
        if self._used + nbytes > self.capacity_bytes + self._lent:
            raise CapacityError(
                f"{self.name.value} tier cannot hold {what} ({nbytes:,} bytes): "
                f"{self._used:,} of {self.capacity_bytes:,} bytes are in use; raise its capacity "
                "or move payloads off it first"
            )
        self._used += nbytes
        self._peak = max(self._peak, self._used)

    def free(self, nbytes: int) -> None:
        """Count ``nbytes`` as no longer used."""
        if nbytes > self._used:
            raise InternalError(
                f"{self.name.value} tier accounting went negative: freeing {nbytes:,} bytes with "
                f"{self._used:,} in use (a payload was freed twice); this is a bug in colossal-chunk"
            )
        self._used -= nbytes

    @property
    def faulted_bytes(self) -> int:
        """Bytes of disk payloads used without a read-ahead since creation ([Note: disk
        fault-ins]); 0 on the other tiers."""
        return self._faulted

    def used(self, key: str, nbytes: int) -> None:
        """The owner is about to read ``key``'s payload of ``nbytes`` (to copy it off the tier, or
        to update it in place): on disk, count them as faulted in unless the payload was read
        ahead since it was last written ([Note: disk fault-ins])."""
        if self.store is not None and not self.store.is_read_ahead(key):
            self._faulted += nbytes

    def finish_read(self, key: str) -> None:
        """``key``'s payload is read next, on this thread: on disk, its read-ahead not taken up
        by the reader yet is done here ([Note: disk read-ahead and write-behind])."""
        if self.store is not None:
            self.store.finish_read(key)

    def reset_peak(self) -> None:
        self._peak = self._used

    def allocate(self, key: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A new 1-D payload on this tier (a file for disk; on the CPU its own mapping, returned
        to the system when dropped: [Note: host payloads]). Does not reserve."""
        if self.store is not None:
            return self.store.allocate(key, numel, dtype)
        if self.device.type == "cpu" and not self.pin_memory:
            return host_empty(numel, dtype)
        # CUDA memory, or pinned host memory (the CUDA host allocator caches those blocks)
        return torch.empty(numel, dtype=dtype, device=self.device, pin_memory=self.pin_memory)

    def claim(self, key: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A new 1-D payload whose values are dead ([Note: dead shards] in ``_shard_io.py``): on
        disk a slot mapped with whatever it holds, nothing written; elsewhere ``allocate``."""
        if self.store is not None:
            return self.store.claim(key, numel, dtype)
        return self.allocate(key, numel, dtype)

    def put(self, key: str, src: torch.Tensor) -> torch.Tensor:
        """A new 1-D payload on this tier holding ``src``'s values (on disk, written into its
        file: [Note: payloads put] in ``disk/_store.py``). Does not reserve."""
        if self.store is not None:
            return self.store.put(key, src)
        t = self.allocate(key, src.numel(), src.dtype)
        t.copy_(src)
        return t

    def stage(self, key: str, tensor: torch.Tensor) -> torch.Tensor:
        """A host copy of the disk payload ``key`` (``tensor``, its mapping) to compute on
        ([Note: staged updates] in ``disk/_store.py``); disk only."""
        if self.store is None:
            raise ConfigError(
                f"the {self.name.value} tier stages no payloads; stage disk payloads only"
            )
        return self.store.stage(key, tensor)

    def unstage(self, key: str, src: torch.Tensor) -> None:
        """Write ``src`` back into the disk payload ``key`` ([Note: staged updates]); disk only."""
        if self.store is None:
            raise ConfigError(
                f"the {self.name.value} tier stages no payloads; stage disk payloads only"
            )
        self.store.unstage(key, src)

    def allocate_gathered(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A gathered chunk's buffer (dropped when the chunk is released, so short-lived):
        uninitialized, from the allocator's cache (the C heap on the CPU, as CUDA's caching
        allocator on a GPU), not a fresh mapping: a new mapping per gather costs a page fault
        and a zero-fill per page every step ([Note: host payloads]). Does not reserve."""
        if self.store is not None:
            raise ConfigError(
                f"the {self.name.value} tier holds no gathered buffers; gather on a memory tier"
            )
        return torch.empty(numel, dtype=dtype, device=self.device)

    def discard(self, key: str) -> None:
        """Forget the payload of ``key`` (removes its file on disk; no-op elsewhere)."""
        if self.store is not None:
            self.store.discard(key)

    def read_ahead(self, key: str) -> None:
        """Start reading the payload of ``key`` into memory before use (disk only; see
        [Note: disk read-ahead and write-behind])."""
        if self.store is not None:
            self.store.read_ahead(key)

    def write_behind(self, key: str, payload: torch.Tensor) -> None:
        """Start writing the payload of ``key`` (just written) out of memory (disk only)."""
        if self.store is not None:
            self.store.write_behind(key, payload)

    def let_go(self, key: str, payload: torch.Tensor) -> None:
        """Drop the pages of ``key``'s payload (only read since last written) from memory, with
        nothing written (disk only)."""
        if self.store is not None:
            self.store.let_go(key, payload)


def build_tiers(config: ChunkConfig) -> dict[TierName, Tier]:
    """The accelerator, host and (unless ``disk_bytes == 0``) disk tiers ``config`` describes."""
    cuda = config.device == "cuda" or (config.device == "auto" and torch.cuda.is_available())
    if config.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device='cuda' but torch sees no CUDA device; use 'auto' or 'cpu'")
    if cuda:
        dev = torch.device("cuda", torch.cuda.current_device())
        acc_cap = config.accelerator_bytes
        if acc_cap is None:
            acc_cap = torch.cuda.mem_get_info(dev)[1]
    else:
        dev = torch.device("cpu")
        acc_cap = UNLIMITED if config.accelerator_bytes is None else config.accelerator_bytes
    tiers = {
        ACC: Tier(ACC, dev, acc_cap, emulated=not cuda),
        HOST: Tier(
            HOST,
            torch.device("cpu"),
            UNLIMITED if config.host_bytes is None else config.host_bytes,
            pin_memory=cuda and config.pin_memory,
        ),
    }
    if config.disk_bytes != 0:
        cap = UNLIMITED if config.disk_bytes is None else config.disk_bytes
        tiers[DISK] = Tier(DISK, torch.device("cpu"), cap, store=DiskStore(config.disk_dir))
    return tiers
