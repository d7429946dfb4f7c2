"""What the owner of a chunk manager is told, and asked, around collectives: one object given at
construction that satisfies ``ManagerHooks``, instead of callables set on the manager (or on the
hooks object) from outside. The manager calls it; it never calls back into the manager."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from ._chunk import Chunk

__all__ = ["ManagerHooks", "NoHooks"]


@runtime_checkable
class ManagerHooks(Protocol):
    """The manager's questions to its owner (``NoHooks`` answers for an owner with none)."""

    def before_collective(self, kind: str, chunk: Chunk) -> None:
        """Called with ``kind`` "all-gather" or "reduce-scatter" before every collective on
        ``chunk`` over more than one rank (a runtime checks there that all ranks agree)."""
        ...

    def keep_gathered(self, chunk: Chunk) -> bool:
        """Asked when a release could drop a sharded chunk's gathered buffer: True keeps it
        (the owner knows the chunk is used again soon)."""
        ...


class NoHooks:
    """``ManagerHooks`` that check nothing and keep nothing gathered (the default)."""

    def before_collective(self, kind: str, chunk: Chunk) -> None:
        """Nothing to check."""

    def keep_gathered(self, chunk: Chunk) -> bool:
        """Never keep: a release drops the gathered buffer."""
        return False
