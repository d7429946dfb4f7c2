"""Which chunk holds what: the one place that knows how precision lays chunks out.

[Note: chunk roles] For a parameter chunk ``c``:
- parameters (the compute dtype) live in ``c``;
- the fp32 values the optimizer updates live in the "master" twin with low precision, else in
  ``c`` itself (fp32);
- gradients while backward fills and reduces them (the working buffer) live in ``c``'s own
  slots with masters (the value is restored from the master afterwards), else in the fp32 "grad"
  twin;
- gradients accumulated over micro-batches live in the lazily created fp32 "acc" twin.
A frozen chunk (``requires_grad=False`` parameters, colossal-chunk's [Note: frozen chunks]) has
no twin: its values are its own, in the compute dtype, and it holds no gradient.
"""

from __future__ import annotations

from colossal_chunk import Chunk, ChunkManager

__all__ = ["ChunkRoles"]


class ChunkRoles:
    """See [Note: chunk roles]. ``masters``: the precision keeps fp32 master weights."""

    def __init__(self, manager: ChunkManager, *, masters: bool):
        self.manager, self.masters = manager, masters

    def fp32(self, c: Chunk) -> Chunk:
        """The chunk whose shard holds ``c``'s fp32 values (what the optimizer updates)."""
        return (
            self.manager.groups[c.chunk_id].twin("master") if self.masters and not c.frozen else c
        )

    def working(self, c: Chunk) -> Chunk:
        """The chunk whose shard holds ``c``'s reduced gradients."""
        return c if self.masters else self.manager.groups[c.chunk_id].twin("grad")

    def restore(self, c: Chunk) -> None:
        """After the parameters' storage held gradients: copy the masters back (no-op in fp32)."""
        if self.masters and not c.frozen:
            master = self.manager.groups[c.chunk_id].twin("master")
            c.payload.copy_(master.payload)
            self.manager.books.count_copy(master.current_tier, c.current_tier, c.shard_bytes)
