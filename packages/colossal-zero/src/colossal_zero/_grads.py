"""The gradients of a step between the end of backward and the optimizer step, as Gemini's
runtime keeps them ([Note: gradients in chunks] and [Note: accumulation] in ``_runtime.py``):
what the optimizer reads (``gradients``), what it calls after updating (``stepped``), and the
stash of earlier micro-batches' gradients."""

from __future__ import annotations

import torch

from colossal_chunk import Chunk, ChunkManager
from colossal_contracts import TensorState

from ._precision import Precision
from ._roles import ChunkRoles
from ._state import ChunkGrads

__all__ = ["StepGradients"]


class StepGradients:
    """The runtime's gradient books after backward; ``GeminiRuntime`` is one."""

    manager: ChunkManager
    precision: Precision
    _chunks: dict[int, ChunkGrads]  # param chunk id -> its gradients' record
    got_grad: set[str]  # names with a gradient since the last step/zero_grad

    @property
    def roles(self) -> ChunkRoles:
        """Which chunk holds parameters, fp32 values and gradients ([Note: chunk roles]); built
        per call because a re-pack replaces chunks (the manager stays)."""
        return ChunkRoles(self.manager, masters=self.precision.master)

    def working(self, c: Chunk) -> Chunk:
        """The chunk whose shard holds ``c``'s reduced gradients (itself with masters)."""
        return self.roles.working(c)

    def stash(self, cid: int) -> None:
        """See [Note: accumulation]: move pending gradients of chunk ``cid`` into its fp32 "acc"
        chunk so that the working buffer can be reused."""
        rec = self._chunks[cid]
        if not rec.pending:
            return
        m = self.manager
        if not any(ch.kind == "acc" for ch in m.chunks.values()):
            m.add_parallel("acc", torch.float32)
        c = m.chunks[cid]
        acc = m.parallel_chunk("acc", c)
        # reduce-scatters and prefetch copies in flight write these shards: finish them first
        m.settle([c, self.working(c), acc])
        src = self.working(c).shard
        acc.shard.add_(src.to(acc.shard.device, torch.float32))  # type: ignore[union-attr]
        rec.pending, rec.accumulated = False, True
        if self.precision.master:
            self.restore_params(c)

    def restore_params(self, c: Chunk) -> None:
        """Copy the fp32 masters into the low-precision parameter shard of chunk ``c``."""
        self._drop_gathered(c)
        self.manager.settle([c])
        self.roles.restore(c)

    def gradients(self, c: Chunk) -> Chunk:
        """The chunk whose shard holds all of ``c``'s gradients of this step (the "acc" chunk
        after accumulation, else the working buffer): what the optimizer reads."""
        self._drop_gathered(c)  # the optimizer writes c's shard next
        if self._chunks[c.chunk_id].accumulated:
            self.stash(c.chunk_id)
            return self.manager.parallel_chunk("acc", c)
        return self.working(c)

    def stepped(self, c: Chunk) -> None:
        """The optimizer updated chunk ``c``'s fp32 shard: refresh low-precision parameters."""
        if self.precision.master:
            self.restore_params(c)
        self._chunks[c.chunk_id].pending = False

    def clear_grads(self) -> None:
        """Forget every gradient (after a step, or ``zero_grad``)."""
        for cid, rec in self._chunks.items():
            if rec.pending and self.precision.master:
                self.restore_params(self.manager.chunks[cid])
            if rec.accumulated:
                self.manager.parallel_chunk("acc", cid).shard.zero_()  # type: ignore[union-attr]
            rec.pending = rec.accumulated = False
        self.got_grad.clear()

    def _drop_gathered(self, c: Chunk) -> None:
        """Before ``c``'s shard is written outside the access protocol: a gathered copy (kept
        or gathered ahead by a forward since backward, [Note: overlap]) would go stale, so it
        is given up (its slice equals the shard: nothing wrote the gathered buffer)."""
        if c.world_size == 1 or not c.is_gathered or not c.all_in(TensorState.HOLD):
            return
        m = self.manager
        m.in_flight.finish(c)
        keep, m.keep_gathered = m.keep_gathered, None
        try:
            m.release_chunks([c])
        finally:
            m.keep_gathered = keep
