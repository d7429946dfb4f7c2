"""Which chunk holds each parameter, as Gemini's runtime looks it up on every operator.

[Note: chunk index] The runtime keeps its own index of the manager's records (parameter name ->
the id of its parameter chunk), built from ``manager.groups`` once the parameters are registered
and again after each re-pack: the only times parameter chunks change, and both happen in the
runtime. Between them the index answers without asking the manager, and the chunk ids of each
operator's parameters are computed once.
"""

from __future__ import annotations

from collections.abc import Mapping

from colossal_chunk import Chunk, ChunkGroup

__all__ = ["ChunkIndex"]


class ChunkIndex:
    """See [Note: chunk index]: a snapshot of the manager's records, rebuilt by its owner."""

    groups: Mapping[int, ChunkGroup]  # the manager's records when built: chunk id -> record
    ids: dict[str, int]  # parameter name -> its chunk's id, in the order they sit in chunks
    _of_op: dict[tuple[str, ...], tuple[int, ...]]  # an operator's names -> their chunk ids

    def __init__(self, groups: Mapping[int, ChunkGroup]):
        self.groups = groups
        self.ids = {n: cid for cid, g in groups.items() for n in g.param.records}
        self._of_op = {}

    def chunk(self, name: str) -> Chunk:
        """The parameter chunk holding parameter ``name`` (its registered name)."""
        return self.groups[self.ids[name]].param

    def chunk_ids(self, names: tuple[str, ...]) -> tuple[int, ...]:
        """The ids of the chunks holding ``names`` (one operator's), each once, in first-name
        order; computed once per tuple of names."""
        ids = self._of_op.get(names)
        if ids is None:
            ids = self._of_op[names] = tuple(dict.fromkeys(self.ids[n] for n in names))
        return ids
