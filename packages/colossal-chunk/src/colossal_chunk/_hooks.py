"""What the owner of a chunk manager is told, and asked, around collectives: one object given
at construction, with no-op defaults (as ``PlacementPolicy``'s hooks), instead of callables set
on the manager from outside."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._chunk import Chunk

__all__ = ["ManagerHooks"]


class ManagerHooks:
    """Override what the owner needs; the defaults call nothing and keep nothing."""

    def before_collective(self, kind: str, chunk: Chunk) -> None:
        """Called with ``kind`` "all-gather" or "reduce-scatter" before every collective on
        ``chunk`` over more than one rank (a runtime checks there that all ranks agree)."""

    def keep_gathered(self, chunk: Chunk) -> bool:
        """Asked when a release could drop a sharded chunk's gathered buffer: True keeps it
        (the owner knows the chunk is used again soon). Default: drop it."""
        return False
