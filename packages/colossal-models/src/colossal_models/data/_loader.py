"""Batches streamed from token shards: a resumable, shuffled order, one slice per data rank.

[Note: data order] The training stream (the documents before the held-out tail) is cut into
``num_windows`` windows of ``seq_len + 1`` tokens (``seq_len`` apart, so each target is the next
input). Each epoch visits every window once in a block shuffle: blocks of ``BLOCK`` windows in a
permuted order, each permuted inside, both drawn from ``(seed, epoch[, block])``; memory is one
block's permutation, whatever the dataset's size. A global counter ``position`` names the next
window; a step takes ``batch_size * dp_size`` consecutive positions and data rank ``r`` reads
positions ``r * batch_size ...`` of them. ``state()`` is ``(epoch, offset, seed)`` with
``position = epoch * num_windows + offset``, so a checkpoint resumes the exact order.

[Note: held-out documents] ``val_fraction`` of the documents, the last ones, are the validation
stream (at least one when there are two or more); a single document is cut at that fraction of
its tokens instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from colossal_contracts import ConfigError

from ._shards import TokenShards

__all__ = ["DataState", "TokenLoader"]

BLOCK = 1024  # windows per shuffle block


@dataclass(frozen=True)
class DataState:
    """Where the loader stands (see [Note: data order]).

    Attributes:
        epoch: full passes over the training windows so far.
        offset: the next window's place in this epoch's order.
        seed: the shuffle seed.
        num_windows: windows per epoch (a resume on other data or another ``seq_len`` is refused).
    """

    epoch: int
    offset: int
    seed: int
    num_windows: int


class TokenLoader:
    """Training and validation batches of ``(inputs, targets)``, each ``(batch_size, seq_len)``
    int64, from ``shards``."""

    def __init__(
        self,
        shards: TokenShards,
        *,
        seq_len: int,
        batch_size: int,
        dp_rank: int = 0,
        dp_size: int = 1,
        seed: int = 0,
        val_fraction: float = 0.05,
    ) -> None:
        if not 0.0 <= val_fraction < 1.0:
            raise ConfigError(f"--val-fraction must be in [0, 1), got {val_fraction}")
        self.shards = shards
        self.seq_len, self.batch_size = seq_len, batch_size
        self.dp_rank, self.dp_size, self.seed = dp_rank, dp_size, seed
        self.train_tokens, self.val_tokens = _split(shards, val_fraction)
        self.num_windows = _windows(self.train_tokens, seq_len, shards, "training")
        self.num_val_windows = (
            _windows(self.val_tokens[1] - self.val_tokens[0], seq_len, shards, "validation")
            if val_fraction > 0
            else 0
        )
        self.position = 0
        self._blocks: dict[tuple[int, int], np.ndarray] = {}  # (epoch, block): permutation
        self._order: tuple[int, np.ndarray, np.ndarray] | None = None  # epoch, blocks, starts

    def state(self) -> DataState:
        epoch, offset = divmod(self.position, self.num_windows)
        return DataState(epoch, offset, self.seed, self.num_windows)

    def load_state(self, state: DataState | dict[str, Any]) -> None:
        """Continue from ``state``; ``ConfigError`` when it belongs to other data or settings."""
        s = state if isinstance(state, DataState) else DataState(**state)
        if s.num_windows != self.num_windows or s.seed != self.seed:
            raise ConfigError(
                f"the checkpoint's data position is for {s.num_windows} windows with seed "
                f"{s.seed}; this run has {self.num_windows} with seed {self.seed} (other data, "
                "--seq-len, --val-fraction or --seed); resume with the run's own settings"
            )
        self.position = s.epoch * s.num_windows + s.offset

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's batch of the next step; advances every rank's position alike."""
        first = self.position + self.dp_rank * self.batch_size
        windows = self._windows_at(np.arange(first, first + self.batch_size, dtype=np.int64))
        self.position += self.batch_size * self.dp_size
        return _pair(self.shards.read_windows(windows * self.seq_len, self.seq_len + 1))

    def val_batches(self, num_batches: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The first ``num_batches`` batches of this rank's slice of the held-out windows
        (in order, wrapping around when they run out); [] without held-out data."""
        if not self.num_val_windows:
            return []
        out = []
        for k in range(num_batches):
            first = (k * self.dp_size + self.dp_rank) * self.batch_size
            rows = [
                self._window((first + j) % self.num_val_windows, self.val_tokens[0])
                for j in range(self.batch_size)
            ]
            out.append(_pair(np.stack(rows)))
        return out

    def _window(self, w: int, base: int = 0) -> np.ndarray:
        start = base + w * self.seq_len
        return self.shards.read(start, start + self.seq_len + 1)

    def _windows_at(self, positions: np.ndarray) -> np.ndarray:
        """The windows the global ``positions`` name (see [Note: data order])."""
        epochs, offsets = np.divmod(positions, self.num_windows)
        out = np.empty_like(positions)
        for epoch in np.unique(epochs).tolist():  # one, or two where an epoch ends
            mask = epochs == epoch
            order, starts = self._epoch_order(epoch)
            slots = np.searchsorted(starts, offsets[mask], side="right") - 1
            blocks = order[slots]
            within = offsets[mask] - starts[slots]
            picked = np.empty_like(within)
            for block in np.unique(blocks).tolist():
                here = blocks == block
                picked[here] = self._block_perm(epoch, block)[within[here]]
            out[mask] = blocks * BLOCK + picked
        return out

    def _epoch_order(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """The epoch's block order and each slot's first offset."""
        if self._order is None or self._order[0] != epoch:
            num_blocks = -(-self.num_windows // BLOCK)
            g = torch.Generator().manual_seed(_mix(self.seed, epoch, -1))
            order = torch.randperm(num_blocks, generator=g).numpy()
            sizes = np.minimum(BLOCK, self.num_windows - order * BLOCK)  # the last may be short
            starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
            self._order = (epoch, order, starts)
        return self._order[1], self._order[2]

    def _block_perm(self, epoch: int, block: int) -> np.ndarray:
        """The permutation inside ``block`` in ``epoch`` (the last two are kept)."""
        key = (epoch, block)
        if key not in self._blocks:
            g = torch.Generator().manual_seed(_mix(self.seed, epoch, block))
            size = min(BLOCK, self.num_windows - block * BLOCK)
            self._blocks[key] = torch.randperm(size, generator=g).numpy()
            while len(self._blocks) > 2:
                self._blocks.pop(next(iter(self._blocks)))
        return self._blocks[key]


def _mix(seed: int, epoch: int, block: int) -> int:
    """A 63-bit seed for (seed, epoch, block) (SplitMix64's finalizer)."""
    z = seed * 0x9E3779B97F4A7C15 + epoch * 0xBF58476D1CE4E5B9 + (block + 1) * 0x94D049BB133111EB
    z &= (1 << 64) - 1
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & ((1 << 64) - 1)
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & ((1 << 64) - 1)
    return (z ^ (z >> 31)) >> 1


def _pair(rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    t = torch.from_numpy(rows.astype(np.int64))
    return t[:, :-1], t[:, 1:]


def _split(shards: TokenShards, val_fraction: float) -> tuple[int, tuple[int, int]]:
    """(training tokens, (start, stop) of the held-out tokens); [Note: held-out documents]."""
    total, docs = shards.num_tokens, shards.num_documents
    if val_fraction == 0:
        return total, (total, total)
    if docs == 1:
        cut = int(total * (1 - val_fraction))
    else:
        held = min(docs - 1, max(1, round(docs * val_fraction)))
        cut = shards.document_end(docs - held - 1)
    return cut, (cut, total)


def _windows(tokens: int, seq_len: int, shards: TokenShards, what: str) -> int:
    n = (tokens - 1) // seq_len
    if n < 1:
        raise ConfigError(
            f"data {shards.index.get('source', shards.directory)} has {tokens:,} {what} tokens, "
            f"too few for --seq-len {seq_len} (needs {seq_len + 1}; --val-fraction holds some "
            "out); give more text or a shorter --seq-len"
        )
    return n
