"""``CommCounter``: calls and bytes of every collective, per (axis, op).

[Note: counted bytes] The counted bytes of one call are the bytes of the *full* logical tensor the
collective operates on, per device: all_reduce, broadcast and reduce count the tensor; all_gather
counts its output; reduce_scatter and all_to_all count their input; point-to-point ``send`` and
``recv`` count each message once on the rank that sends or receives it. On a ring of ``p`` ranks the
bytes each device sends are ``counted * (p - 1) / p`` (twice that for all_reduce). A collective
over an axis of size 1 moves nothing and is neither run nor counted.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["COMM_OPS", "CommCounter", "CommStat"]

COMM_OPS: tuple[str, ...] = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "reduce",
    "all_to_all",
    "send",
    "recv",
)


@dataclass(frozen=True)
class CommStat:
    """Totals of one (axis, op) pair.

    Attributes:
        calls: number of collective calls.
        bytes: counted bytes (see [Note: counted bytes]).
    """

    calls: int = 0
    bytes: int = 0


class CommCounter:
    """Accumulates ``CommStat`` per (axis, op); owned by one ``CountedComm``, never global."""

    _stats: dict[tuple[str, str], CommStat]

    def __init__(self) -> None:
        self._stats = {}

    def record(self, axis: str, op: str, nbytes: int) -> None:
        """Add one call of ``op`` along ``axis`` that counted ``nbytes``."""
        old = self._stats.get((axis, op), CommStat())
        self._stats[(axis, op)] = CommStat(old.calls + 1, old.bytes + int(nbytes))

    def reset(self) -> None:
        """Forget everything recorded so far."""
        self._stats.clear()

    def snapshot(self) -> dict[tuple[str, str], CommStat]:
        """A copy of the totals keyed by (axis, op); picklable."""
        return dict(self._stats)

    def _select(self, axis: str | None, op: str | None) -> list[CommStat]:
        return [
            s
            for (a, o), s in self._stats.items()
            if (axis is None or a == axis) and (op is None or o == op)
        ]

    def bytes(self, axis: str | None = None, op: str | None = None) -> int:
        """Counted bytes, summed over every (axis, op) matching the filters (None: all)."""
        return sum(s.bytes for s in self._select(axis, op))

    def calls(self, axis: str | None = None, op: str | None = None) -> int:
        """Number of calls matching the filters (None: all)."""
        return sum(s.calls for s in self._select(axis, op))

    def __repr__(self) -> str:
        body = ", ".join(f"{a}/{o}: {s.calls}x {s.bytes}B" for (a, o), s in self._stats.items())
        return f"CommCounter({body})"
