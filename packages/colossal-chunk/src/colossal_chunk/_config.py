"""The settings of a chunk manager, in one frozen dataclass."""

from __future__ import annotations

import os
from dataclasses import dataclass

from colossal_contracts import ConfigError, TierName

__all__ = ["ChunkConfig"]


@dataclass(frozen=True)
class ChunkConfig:
    """How chunks are sized and where they may live.

    Attributes:
        chunk_numel: elements per chunk (``search_chunk_size`` picks one with little padding); it is
            rounded up to a multiple of the data-parallel world size so every rank owns an equal
            shard. Every tensor must fit in one chunk.
        accelerator_bytes: budget of chunk payloads on the compute tier; None means the whole device
            on CUDA and no limit on an emulated accelerator.
        host_bytes: budget of chunk payloads in host memory; None means no limit.
        disk_bytes: budget of chunk payloads on disk; None means no limit, 0 disables the disk tier.
        disk_dir: directory for disk payloads; None makes a temporary one, removed on close.
        device: "auto" (CUDA when present, else an emulated accelerator), "cuda" or "cpu"
            ("cpu" forces the emulated accelerator even where CUDA exists).
        home: tier where chunks are placed at registration ("host" or "accelerator").
        pin_memory: allocate host payloads in pinned memory when the accelerator is CUDA.
        read_ahead_bytes: bytes of ``host_bytes`` kept for disk pages read ahead of use
            ([Note: read-ahead window]); None: up to four fp32 shards, at most a quarter of
            ``host_bytes``. Only with a disk tier and a host budget.
        frozen_chunk_numel: elements per frozen chunk, rounded up the same way; None: the same
            as ``chunk_numel``. Frozen tensors are packed apart from trainable ones, so each kind
            can have the size that wastes least for its own tensors ([Note: chunk size per
            kind] in ``_register.py``).
    """

    chunk_numel: int
    accelerator_bytes: int | None = None
    host_bytes: int | None = None
    disk_bytes: int | None = None
    disk_dir: str | os.PathLike[str] | None = None
    device: str = "auto"
    home: str = "host"
    pin_memory: bool = True
    read_ahead_bytes: int | None = None
    frozen_chunk_numel: int | None = None

    def __post_init__(self) -> None:
        if self.chunk_numel <= 0:
            raise ConfigError(
                f"chunk_numel must be positive, got {self.chunk_numel}; "
                "use search_chunk_size() to choose one from the parameter sizes"
            )
        if self.frozen_chunk_numel is not None and self.frozen_chunk_numel <= 0:
            raise ConfigError(
                f"frozen_chunk_numel must be positive or None (chunk_numel), got "
                f"{self.frozen_chunk_numel}"
            )
        for field_name in ("accelerator_bytes", "host_bytes", "disk_bytes", "read_ahead_bytes"):
            value = getattr(self, field_name)
            if value is not None and value < 0:
                raise ConfigError(f"{field_name} must be >= 0 or None (no limit), got {value}")
        if self.device not in ("auto", "cuda", "cpu"):
            raise ConfigError(f"device must be 'auto', 'cuda' or 'cpu', got {self.device!r}")
        if self.home not in (TierName.HOST.value, TierName.ACCELERATOR.value):
            raise ConfigError(f"home must be 'host' or 'accelerator', got {self.home!r}")

    def chunk_numel_for(self, world_size: int, *, frozen: bool = False) -> int:
        """Elements per chunk over ``world_size`` ranks: ``chunk_numel`` (``frozen_chunk_numel``,
        else ``chunk_numel``, with ``frozen``) rounded up to a multiple of ``world_size``."""
        numel = (self.frozen_chunk_numel or self.chunk_numel) if frozen else self.chunk_numel
        return -(-numel // world_size) * world_size
