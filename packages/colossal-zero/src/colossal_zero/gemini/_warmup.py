"""What Gemini's warmup step learns, and checks that every rank learned the same.

[Note: warmup] The first iteration records, moment by moment ([Note: moments] in
colossal-contracts: one per operator that reads parameters, forward and backward), the parameter
names used, through a ``StepRecorder`` when one is given (memtrace's ``MomentRecorder`` measures
non-model bytes per moment) or else with one constant reserve per moment
(``GeminiConfig.non_model_bytes``). The result is one ``MemStatsSource`` for the placement policy,
and the first-use order that chunks are re-packed in ([Note: first-use order] in colossal-chunk).

[Note: rank agreement] Every rank must use the same parameters in the same order. During warmup
every collective on a chunk is preceded by a tiny all-gather of (operation, chunk id), so a rank
that diverges is found at the first collective that differs, and every rank raises a
``DistributedError`` naming what each rank wanted; later steps compare a digest of the step's
access order at the end of backward (one 8-byte all-gather per step).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable, Sequence

import torch
import torch.distributed as dist

from colossal_contracts import (
    DistributedError,
    MemStatsSource,
    OrderStats,
    StepRecorder,
    TierName,
)

__all__ = ["OrderDigest", "WarmupTrace", "agree"]


class WarmupTrace:
    """Collects the warmup step's compute order (and drives the recorder, if any)."""

    def __init__(self, recorder: StepRecorder | None, non_model_bytes: int):
        self.recorder = recorder
        self.non_model_bytes = non_model_bytes
        self.order: list[tuple[str, ...]] = []
        self.backward_from: int | None = None  # the first backward moment of ``order``

    def start(
        self, model_bytes: Callable[[TierName], int], model_tensors: Iterable[object]
    ) -> None:
        self.order.clear()
        self.backward_from = None
        if self.recorder is not None:
            self.recorder.start(model_bytes, model_tensors)

    def moment(self, names: tuple[str, ...]) -> None:
        self.order.append(names)
        if self.recorder is not None:
            self.recorder.cut(names)

    def mark_backward(self) -> None:
        """Backward begins: the moments recorded from now on are backward's."""
        if self.backward_from is None:
            self.backward_from = len(self.order)

    def finish(self) -> MemStatsSource:
        """The step's statistics: measured, or the constant reserve at every moment."""
        if self.recorder is not None:
            return self.recorder.finish()
        return OrderStats(self.order, [self.non_model_bytes] * len(self.order))

    def close(self) -> None:
        """Remove what the recorder installed (call outside backward)."""
        if self.recorder is not None:
            self.recorder.close()

    def first_use(self) -> list[str]:
        """Parameter names in the order the step first used them."""
        return list(dict.fromkeys(n for m in self.order for n in m))


class OrderDigest:
    """A running, process-independent digest of a step's access order (CRC-32 per name)."""

    def __init__(self) -> None:
        self._crc: dict[str, int] = {}
        self.value = 0

    def reset(self) -> None:
        self.value = 0

    def add(self, names: tuple[str, ...]) -> None:
        crc = self._crc
        v = self.value
        for n in names:
            c = crc.get(n)
            if c is None:
                c = crc[n] = zlib.crc32(n.encode())
            v = (v * 1_000_003 + c + 1) & 0x7FFF_FFFF_FFFF_FFFF
        self.value = (v * 31 + 7) & 0x7FFF_FFFF_FFFF_FFFF  # moment boundary


def _gather_longs(values: Sequence[int], group: dist.ProcessGroup) -> list[list[int]]:
    t = torch.tensor(list(values), dtype=torch.int64)
    if dist.get_backend(group) == "nccl":
        t = t.cuda()
    out = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(out, t, group=group)
    return [o.tolist() for o in out]


def agree(
    group: dist.ProcessGroup,
    what: str,
    key: Sequence[int],
    describe: Callable[[list[int]], str],
) -> None:
    """Raise ``DistributedError`` on every rank unless every rank passes the same ``key``.

    ``describe(key)`` turns a rank's key into words for the message (what that rank was doing).
    """
    keys = _gather_longs(key, group)
    if all(k == keys[0] for k in keys):
        return
    # global ranks: the group may be one tp coordinate's data-parallel ranks, not the world
    lines = "; ".join(
        f"rank {dist.get_global_rank(group, r)}: {describe(k)}" for r, k in enumerate(keys)
    )
    raise DistributedError(
        f"ranks diverged at {what}: {lines}. Every data-parallel rank must use the same "
        "parameters in the same order in each step (as with DDP without "
        "find_unused_parameters); make the forward take the same path on every rank"
    )
