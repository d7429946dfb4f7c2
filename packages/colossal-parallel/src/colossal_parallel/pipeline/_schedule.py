"""Pipeline schedules as pure data: the ordered forward/backward actions of each rank.

A schedule is a list of ``Action``s per ``pp`` rank; the runtime (``_runtime.py``) executes them,
receiving an action's input just before it and sending its output right after. ``simulate``
replays the lists with fixed forward and backward times, which checks that the order can never
deadlock and gives the ideal timeline whose idle fraction the formulas describe.

[Note: schedules] With ``p`` ranks, ``m`` micro-batches and ``v`` chunks per rank:
- GPipe: every forward, then every backward. Idle fraction ``(p-1)/(m+p-1)``; activations of all
  ``m`` micro-batches are alive at the turn.
- 1F1B (PipeDream-flush): rank ``r`` runs ``p-r-1`` warmup forwards, then alternates one forward
  and one backward, then drains. Same idle fraction, at most ``p - r`` micro-batches alive.
- Interleaved 1F1B (Megatron): each rank holds ``v`` chunks; forwards go round the chunks in
  groups of ``p`` micro-batches (needs ``m % p == 0``), with ``2(p-r-1) + (v-1)p`` warmup
  forwards. The bubble shrinks ``v`` times: idle fraction ``((p-1)/v) / (m + (p-1)/v)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

from colossal_contracts import ConfigError

__all__ = [
    "SCHEDULES",
    "Action",
    "PipelineSchedule",
    "ScheduleKind",
    "ideal_idle_fraction",
    "idle_fractions",
    "simulate",
]

ScheduleKind = Literal["gpipe", "1f1b", "interleaved"]
SCHEDULES: tuple[str, ...] = ("gpipe", "1f1b", "interleaved")


class Action(NamedTuple):
    """One unit of work on one rank: ``kind`` "F" (forward) or "B" (backward) of
    ``microbatch`` through the rank's chunk ``chunk`` (virtual stage ``chunk * p + rank``)."""

    kind: str
    microbatch: int
    chunk: int


@dataclass(frozen=True)
class PipelineSchedule:
    """Which schedule drives how many micro-batches through how many chunks per rank.

    Attributes:
        kind: "gpipe", "1f1b" or "interleaved".
        num_microbatches: ``m``; must divide the batch, and for interleaved be a multiple of pp.
        num_virtual: ``v``, chunks (virtual stages) per rank; >= 2 for interleaved, else 1.
    """

    kind: ScheduleKind = "1f1b"
    num_microbatches: int = 1
    num_virtual: int = 1

    def __post_init__(self) -> None:
        if self.kind not in SCHEDULES:
            raise ConfigError(f"pipeline schedule must be one of {SCHEDULES}, got {self.kind!r}")
        for name in ("num_microbatches", "num_virtual"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"PipelineSchedule.{name} must be a positive int, got {value!r}")
        if self.kind == "interleaved" and self.num_virtual < 2:
            raise ConfigError(
                "the interleaved schedule needs num_virtual >= 2 chunks per rank; use "
                "kind='1f1b' for one chunk per rank"
            )
        if self.kind != "interleaved" and self.num_virtual != 1:
            raise ConfigError(
                f"{self.kind} runs one chunk per rank (num_virtual=1); use kind='interleaved' "
                f"for num_virtual={self.num_virtual}"
            )

    def validate(self, num_ranks: int, batch_size: int | None = None) -> None:
        """``ConfigError`` unless the schedule fits ``num_ranks`` pp ranks (and the batch)."""
        m = self.num_microbatches
        if self.kind == "interleaved" and m % num_ranks:
            raise ConfigError(
                f"the interleaved schedule needs the number of micro-batches ({m}) to be a "
                f"multiple of the pipeline size ({num_ranks}); use num_microbatches="
                f"{(m // num_ranks + 1) * num_ranks} or kind='1f1b'"
            )
        if batch_size is not None and batch_size % m:
            raise ConfigError(
                f"{m} micro-batches do not divide the batch of {batch_size}; use a batch that is "
                f"a multiple of {m} or a number of micro-batches that divides {batch_size}"
            )

    def actions(self, num_ranks: int, rank: int) -> list[Action]:
        """The ordered actions of the rank at ``pp`` coordinate ``rank``."""
        self.validate(num_ranks)
        p, m = num_ranks, self.num_microbatches
        if self.kind == "gpipe":
            return [Action("F", i, 0) for i in range(m)] + [Action("B", i, 0) for i in range(m)]
        if self.kind == "1f1b":
            warmup = min(p - rank - 1, m)
            fwd = [Action("F", i, 0) for i in range(m)]
            bwd = [Action("B", i, 0) for i in range(m)]
        else:
            v, total = self.num_virtual, m * self.num_virtual
            warmup = total if m == p else min(2 * (p - rank - 1) + (v - 1) * p, total)
            fwd = [Action("F", _mb(k, p, v), (k // p) % v) for k in range(total)]
            bwd = [Action("B", _mb(k, p, v), v - 1 - (k // p) % v) for k in range(total)]
        out = fwd[:warmup]
        for i in range(len(fwd) - warmup):
            out += [fwd[warmup + i], bwd[i]]
        return out + bwd[len(fwd) - warmup :]


def _mb(k: int, p: int, v: int) -> int:
    """Micro-batch of the ``k``-th forward (or backward) of a rank under interleaving."""
    return (k // (p * v)) * p + k % p


def simulate(
    schedule: PipelineSchedule, num_ranks: int, *, t_forward: float = 1.0, t_backward: float = 2.0
) -> list[list[tuple[Action, float, float]]]:
    """Replay every rank's actions with fixed durations: ``(action, start, end)`` per rank.

    An action starts when its rank is free and its input exists (the previous virtual stage's
    forward, or the next one's backward). ``ConfigError`` if the order would deadlock.
    """
    p, v = num_ranks, schedule.num_virtual
    last = p * v - 1
    queues = [schedule.actions(p, r) for r in range(p)]
    pos, free = [0] * p, [0.0] * p
    done: dict[tuple[str, int, int], float] = {}  # (kind, microbatch, virtual stage) -> end
    out: list[list[tuple[Action, float, float]]] = [[] for _ in range(p)]
    remaining = sum(len(q) for q in queues)
    while remaining:
        progressed = False
        for r in range(p):
            if pos[r] == len(queues[r]):
                continue
            a = queues[r][pos[r]]
            stage = a.chunk * p + r
            if a.kind == "F":
                dep = ("F", a.microbatch, stage - 1) if stage > 0 else None
            else:
                dep = ("B", a.microbatch, stage + 1) if stage < last else ("F", a.microbatch, last)
            if dep is not None and dep not in done:
                continue
            start = max(free[r], done[dep] if dep else 0.0)
            end = start + (t_forward if a.kind == "F" else t_backward)
            done[(a.kind, a.microbatch, stage)] = free[r] = end
            out[r].append((a, start, end))
            pos[r] += 1
            remaining -= 1
            progressed = True
        if not progressed:
            raise ConfigError(f"pipeline schedule {schedule} deadlocks on {p} ranks")
    return out


def ideal_idle_fraction(
    kind: str, num_ranks: int, num_microbatches: int, num_virtual: int = 1
) -> float:
    """The bubble formula: ``(p-1)/(m+p-1)``, with ``(p-1)/v`` in place of ``p-1`` interleaved."""
    b = (num_ranks - 1) / (num_virtual if kind == "interleaved" else 1)
    return b / (num_microbatches + b)


def idle_fractions(timeline: Sequence[Sequence[tuple[Action, float, float]]]) -> list[float]:
    """Per rank: ``1 - busy / span``, with span from the first start to the last end anywhere."""
    t0 = min(s for rank in timeline for _, s, _ in rank)
    t1 = max(e for rank in timeline for _, _, e in rank)
    return [1.0 - sum(e - s for _, s, e in rank) / (t1 - t0) for rank in timeline]
