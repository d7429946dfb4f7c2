"""One record per parameter chunk: the chunk, its typed twins, and the state of each.

[Note: one record per chunk] Everything the manager and its owner know about one unit of
sharding lives on two objects, as FSDP2's ``FSDPParamGroup`` holds its parameters, training state
and communication state together: the ``Chunk`` (its ``Lifecycle`` and its residency: tier,
prefetch copy in flight, kept, disk bytes read ahead) and the ``ChunkGroup`` of a parameter chunk
(its twins by ``ChunkKind`` and the ``GradPhase`` of its gradients). No set or map beside them
holds a chunk's state: "is a collective in flight" is ``chunk.lifecycle``, "is it kept" is
``chunk.kept``, "where are its reduced gradients" is ``group.grads``. (What remains beside them
are caches and schedules: disk payloads kept for reuse, an overlap schedule, an optimizer's shard
views.) The manager's registry owns the groups (``ChunkManager.groups``, ``registry.group_of``); a
re-pack makes new ones.

[Note: chunk residency] Where a chunk's payload is, and what is under way for it, is on the
chunk ([Note: one record per chunk] in ``_group.py``): ``tier`` (where the shard lives),
``prefetch`` (a copy to the compute tier in flight and the tier it comes from: the shard counts
on the compute tier already), ``kept`` (stays on the compute tier: [Note: kept chunks] in
``_placement.py``) and ``read_ahead_bytes`` (its disk pages read ahead within the window:
[Note: read-ahead window] in ``disk/_read_ahead.py``), ``dead`` (its values consumed: [Note:
dead shards] in ``_shard_io.py``). ``Placement`` sets them; nothing else keeps a set of chunks
beside them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum, StrEnum
from typing import TYPE_CHECKING

import torch

from colossal_contracts import ConfigError, StateTransitionError

if TYPE_CHECKING:
    from ._chunk import Chunk

__all__ = ["ChunkGroup", "ChunkKind", "GradPhase", "Lifecycle"]


class ChunkKind(StrEnum):
    """What a chunk holds. A twin has its parameter chunk's layout in its own dtype. Owners may
    name other twin kinds with a plain string (``ChunkManager.add_parallel``)."""

    PARAM = "param"  # parameters (compute dtype); the views' storage
    MASTER = "master"  # fp32 (or fp64) master weights
    GRAD = "grad"  # reduced gradients, when they do not go into the parameter chunk
    ACC = "acc"  # gradients of earlier micro-batches, summed
    EXP_AVG = "exp_avg"  # Adam's first moment
    EXP_AVG_SQ = "exp_avg_sq"  # Adam's second moment


class Lifecycle(Enum):
    """Where a chunk's gathered buffer is ([Note: one collective in flight] in ``_chunk.py``).
    One rank: always GATHERED (the shard is the buffer). Changes go through ``to``."""

    SHARDED = "sharded"  # the shard alone holds the payload; no gathered buffer
    GATHERING = "gathering"  # an all-gather into the gathered buffer is in flight
    GATHERED = "gathered"  # the gathered buffer holds every rank's values (or zeros to fill)
    REDUCING = "reducing"  # a reduce-scatter out of the gathered buffer is in flight

    def to(self, new: Lifecycle, chunk_id: int) -> Lifecycle:
        """``new`` if ``self -> new`` is legal, else ``StateTransitionError``."""
        if new in _LEGAL[self]:
            return new
        raise StateTransitionError(
            f"chunk {chunk_id}: illegal lifecycle move {self.name} -> {new.name}; from "
            f"{self.name} only {', '.join(s.name for s in _LEGAL[self])} may follow"
        )

    @property
    def in_flight(self) -> bool:
        return self is Lifecycle.GATHERING or self is Lifecycle.REDUCING


_L = Lifecycle
_LEGAL: dict[Lifecycle, frozenset[Lifecycle]] = {
    _L.SHARDED: frozenset({_L.GATHERING, _L.GATHERED}),  # gathered / materialised
    _L.GATHERING: frozenset({_L.GATHERED}),  # the gather finished
    # released, or reduce-scattered (REDUCING; SHARDED at once for a synchronous one)
    _L.GATHERED: frozenset({_L.SHARDED, _L.REDUCING}),
    _L.REDUCING: frozenset({_L.SHARDED}),  # the reduce-scatter finished
}


class GradPhase(Enum):
    """Where a parameter chunk's gradients of this step are (its working buffer: the parameter
    chunk's gathered buffer with masters or sharded, else its "grad" twin)."""

    EMPTY = "empty"  # none since the last step, stash or zero_grad
    FILLING = "filling"  # this backward's gradients are arriving (or kept: [Note: kept gradients])
    REDUCED = "reduced"  # the working buffer holds reduced gradients not yet stepped or stashed


@dataclass(eq=False)
class ChunkGroup:
    """A parameter chunk, its twins and its gradients' state; see [Note: one record per chunk].

    Attributes:
        param: the parameter chunk.
        twins: kind -> twin chunk of the same layout (none for a frozen chunk).
        grads: the phase of this step's gradients in the working buffer.
        accumulated: the "acc" twin holds gradients of earlier micro-batches (beside ``grads``).
        kept_grads: autograd's own gradients of this step by name, not yet copied into the working
            buffer (one rank, colossal-zero's [Note: kept gradients]).
        unused: trainable parameters the owner's warmup step never read (their gradients are
            zeros).
    """

    param: Chunk
    twins: dict[str, Chunk] = field(default_factory=dict)
    grads: GradPhase = GradPhase.EMPTY
    accumulated: bool = False
    kept_grads: dict[str, torch.Tensor] = field(default_factory=dict)
    unused: frozenset[str] = frozenset()

    @property
    def chunk_id(self) -> int:
        return self.param.chunk_id

    def twin(self, kind: ChunkKind | str) -> Chunk:
        """The ``kind`` twin; ``ConfigError`` naming the kinds there are when it has none."""
        twin = self.twins.get(kind)
        if twin is None:
            raise ConfigError(
                f"chunk {self.param.chunk_id} has no {str(kind)!r} twin (it has "
                f"{sorted(self.twins) or 'none'}); add_parallel({str(kind)!r}, ...) first"
                + (" (frozen chunks get none)" if self.param.frozen else "")
            )
        return twin

    @property
    def holds_gradients(self) -> bool:
        """True while any gradient of this step is held (filling, reduced or accumulated)."""
        return self.grads is not GradPhase.EMPTY or self.accumulated

    def clear_gradients(self) -> None:
        """Forget this step's gradients' state (the owner zeroed or stepped them)."""
        self.grads, self.accumulated = GradPhase.EMPTY, False
        self.kept_grads.clear()
