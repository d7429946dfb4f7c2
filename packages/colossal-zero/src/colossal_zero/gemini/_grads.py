"""The gradients of a step between the end of backward and the optimizer step, as Gemini's
runtime keeps them ([Note: gradients in chunks] in ``_collect.py``, [Note: accumulation] in
``_runtime.py``): what the optimizer reads (``gradients``), what it calls after updating
(``stepped``), and the stash of earlier micro-batches' gradients.

[Note: kept gradients] In a resident step on one rank without fp32 masters (the runtime's
``keeping``) there is nothing to reduce, so a parameter's gradient is not copied into the fp32
"grad" chunk: the runtime keeps autograd's own tensor in its chunk's record (colossal-chunk's
``ChunkGroup.kept_grads``, as plain PyTorch keeps ``p.grad``; the group's phase is FILLING until
backward ends, then REDUCED) and the optimizer reads it there (``grad_pieces``), which saves one copy of
every gradient per step. Whatever else needs the working buffer gets it filled first
(``_fill_working``: kept gradients in their slots, the chunk's other tensors zero, what the
general path writes), and a stash adds kept gradients into the "acc" chunk directly (adding the
zeros is skipped: ``x + 0.0 == x`` for every sum that holds, none is ``-0.0``), so every value is
bit for bit the general path's. The forward of such a step runs without the operator hooks:
they would only stash, and a chunk's first kept gradient stashes instead. Kept gradients are
compute-tier memory beside the chunks (the idle "grad" chunk included): the runtime keeps them
only when the manager shows room for them at every moment."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from colossal_chunk import Chunk, ChunkManager, GradPhase
from colossal_contracts import ParamSharding, TensorState, TierName

from ..optim._precision import Precision
from ._roles import ChunkRoles

__all__ = ["AfterStep", "StepGradients"]

NormPieces = list[tuple[torch.Tensor, ParamSharding | None]]


@dataclass(eq=False)
class AfterStep:
    """What the optimizer keeps from its step for later, held by the runtime, which lets it go
    as the next forward begins (``forward_begins``; the runtime calls nothing of the optimizer).

    Attributes:
        norm_due: the last step's gradient pieces whose norm is computed when first read, and
            the ``forwards`` count they belong to (the optimizer's [Note: norm on demand]);
            None: none due.
        views: chunk id -> the fp32 and state shard views of the fused update (the optimizer's
            [Note: one fused call]), kept while those shards stay the same tensors.
    """

    norm_due: tuple[NormPieces, int] | None = None
    views: dict[int, tuple[tuple, tuple[str, ...], list[tuple]]] = field(default_factory=dict)

    def forward_begins(self, steady: bool) -> None:
        """A forward begins after warmup: the pieces go (they may be kept gradients, or views of
        shards that move); the views stay only if ``steady`` (nothing moves before the next step)."""
        if self.norm_due is not None:
            self.norm_due = ([], -1)
        if not steady:
            self.views.clear()


class StepGradients:
    """The runtime's gradient books after backward; ``GeminiRuntime`` is one."""

    manager: ChunkManager
    precision: Precision
    got_grad: set[str]  # names with a gradient since the last step/zero_grad
    after_step: AfterStep  # what the optimizer keeps until the next forward
    _read_with: tuple[str, object] | None  # see read_gradients_with

    def read_gradients_with(self, kind: str, *, layout: object = None) -> None:
        """Say where the optimizer reads reduced gradients: a parameter chunk's on the tier of
        its ``kind`` twin (its states), for the chunk layout ``layout`` (``manager.groups`` when
        it placed the states for it; None: every layout). Until then, and for another layout,
        they are read where they land."""
        self._read_with = (kind, layout)

    def reads_on_host(self, c: Chunk) -> bool:
        """Whether parameter chunk ``c``'s reduced gradients are read off the accelerator (so a
        reduce-scatter into a host shard leaves them there); see ``read_gradients_with``."""
        said = self._read_with
        if said is None or (said[1] is not None and said[1] is not self.manager.groups):
            return False
        return self.manager.groups[c.chunk_id].twin(said[0]).tier is not TierName.ACCELERATOR

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
        rec = self.manager.groups[cid]
        if rec.grads is not GradPhase.REDUCED:
            return
        m = self.manager
        if "acc" not in rec.twins:  # the first stash: every trainable chunk gets one
            m.add_parallel("acc", self.precision.state_dtype)
        c, acc = rec.param, rec.twin("acc")
        if rec.kept_grads:  # [Note: kept gradients]: one rank, nothing in flight
            dev = acc.payload.device
            for n, g in rec.kept_grads.items():
                acc.shard_part(n).add_(g.reshape(-1).to(dev, acc.dtype))
            rec.kept_grads.clear()
        else:
            # reduce-scatters and prefetch copies in flight write these shards: finish them first
            m.settle([c, self.working(c), acc])
            src = self.working(c).payload
            acc.payload.add_(src.to(acc.payload.device, acc.dtype))
        rec.grads, rec.accumulated = GradPhase.EMPTY, True
        if self.precision.master:
            self.restore_params(c)

    def restore_params(self, c: Chunk) -> None:
        """Copy the fp32 masters into the low-precision parameter shard of chunk ``c``."""
        self._drop_gathered(c)
        self.manager.settle([c])
        self.roles.restore(c)

    def grad_home(self, c: Chunk) -> Chunk:
        """The chunk that holds ``c``'s gradients of this step, or stands for kept ones (on its
        tier), without filling or stashing anything: the "acc" chunk after accumulation, else
        the working buffer."""
        if self.manager.groups[c.chunk_id].accumulated:
            return self.manager.groups[c.chunk_id].twin("acc")
        return self.working(c)

    def gradients(self, c: Chunk) -> Chunk:
        """The chunk whose shard holds all of ``c``'s gradients of this step (the "acc" chunk
        after accumulation, else the working buffer): what the optimizer reads."""
        self._drop_gathered(c)  # the optimizer writes c's shard next
        rec = self.manager.groups[c.chunk_id]
        if rec.accumulated:
            self.stash(c.chunk_id)
            return rec.twin("acc")
        if rec.kept_grads:
            self._fill_working(c)
        return self.working(c)

    def grad_pieces(self, c: Chunk, names: list[str]) -> list[torch.Tensor]:
        """This rank's flat gradient slice of each of ``names`` (tensors of chunk ``c`` that
        this rank holds a slice of), what the optimizer reads: the kept gradients themselves
        where they are kept ([Note: kept gradients]), else views of ``gradients(c)``'s shard."""
        rec = self.manager.groups[c.chunk_id]
        kept = rec.kept_grads
        if kept and not rec.accumulated and all(n in kept for n in names):
            return [kept[n].reshape(-1) for n in names]
        grads = self.gradients(c)
        return [grads.shard_part(n) for n in names]

    def _fill_working(self, c: Chunk) -> None:
        """Write chunk ``c``'s kept gradients into its working buffer (one rank: the shard) and
        zeros into its other tensors' slots, as the general path leaves it."""
        rec = self.manager.groups[c.chunk_id]
        g = self.working(c)
        for n in c.records:
            view = g.shard_part(n)
            grad = rec.kept_grads.get(n)
            if grad is None:
                view.zero_()
            else:
                view.copy_(grad.reshape(-1))
        rec.kept_grads.clear()
        self.manager.shard_io.written([g])  # live again ([Note: dead shards] in colossal-chunk)

    def stepped(self, c: Chunk) -> None:
        """The optimizer updated chunk ``c``'s fp32 shard: refresh low-precision parameters.
        Without masters its "grad" chunk's values are consumed: moves until the next backward
        fills it copy and write nothing (colossal-chunk's [Note: dead shards])."""
        if self.precision.master:
            self.restore_params(c)
        else:
            self.manager.shard_io.dead([self.working(c)])
        rec = self.manager.groups[c.chunk_id]
        if rec.grads is GradPhase.REDUCED:
            rec.grads = GradPhase.EMPTY
        rec.kept_grads.clear()

    def clear_grads(self) -> None:
        """Forget every gradient (after a step, or ``zero_grad``)."""
        for rec in self.manager.groups.values():
            if rec.grads is GradPhase.REDUCED and self.precision.master:
                self.restore_params(rec.param)
            if rec.accumulated:
                rec.twin("acc").payload.zero_()
            if rec.grads is GradPhase.REDUCED:  # a chunk still filling keeps filling
                rec.grads = GradPhase.EMPTY
            rec.accumulated = False
            rec.kept_grads.clear()
        self.got_grad.clear()

    def _drop_gathered(self, c: Chunk) -> None:
        """Before ``c``'s shard is written outside the access protocol: a gathered copy (kept
        or gathered ahead by a forward since backward, [Note: overlap]) would go stale, so it
        is given up (its slice equals the shard: nothing wrote the gathered buffer)."""
        if c.world_size == 1 or not c.is_gathered or not c.all_in(TensorState.HOLD):
            return
        self.manager.settle([c], reshard=True)
