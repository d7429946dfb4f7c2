"""Where the optimizer's states live: on the accelerator, chunk by chunk, where the plan has room.

[Note: state placement] Adam's exp_avg / exp_avg_sq chunks (and, with low precision, the fp32
master chunk) of a parameter chunk sit together on one tier, and the hybrid Adam updates them
there ([Note: hybrid update]). They start on the host (on the accelerator, kept there, when
neither host nor disk can take them). Once the policy knows the compute order, the manager
records for one whole step, moment by moment, the accelerator bytes no eviction could free
(chunks in use or awaiting reduction, kept chunks) and the bytes resident at all
(``ChunkManager.books.track_demand``). The room for states is

    min over moments m of (room(m) - used(m)),  room(m) = budget - 1.1 x non-model(m)

with used = resident bytes ("free": states displace nothing, so no extra moves) or used =
unfreeable bytes ("demand": states also take what caching filled, so fewer host bytes and more
moves); at the optimizer moment the room must also hold one chunk's fp32 values and gradients
while it is updated. Parameter chunks take their states to the accelerator in first-use order (the
first chunks of forward are the last of backward: still resident when the optimizer runs) while
they fit; those state chunks are then kept there ([Note: kept chunks] in colossal-chunk), so
eviction works in the room that is left, which at every moment still holds what must be there.
Colossal-AI's auto placement moves a share of the fp32 chunks (``gpu_margin_mem_ratio`` of the
margin its warmup left unused, divided by 3 tensors per parameter); the per-moment demand lets
this plan use room that caching filled during warmup but no moment needed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from colossal_chunk import Chunk, ChunkManager
from colossal_contracts import PlacementPolicy, TierName

__all__ = ["StatePlan", "plan_states"]

ACC = TierName.ACCELERATOR


@dataclass(frozen=True)
class StatePlan:
    """What ``plan_states`` decided.

    Attributes:
        room_bytes: the room for states (share applied), bytes on the accelerator.
        chunks: ids of the parameter chunks whose states go to the accelerator.
        state_bytes: bytes those state chunks take there.
    """

    room_bytes: int
    chunks: tuple[int, ...]
    state_bytes: int


def plan_states(
    manager: ChunkManager,
    policy: PlacementPolicy,
    states_of: Callable[[Chunk], Sequence[Chunk]],
    update_bytes: Callable[[Chunk], int],
    mode: str,
) -> StatePlan:
    """See [Note: state placement]. ``states_of(c)``: the chunks that move with ``c``'s states;
    ``update_bytes(c)``: accelerator bytes ``c``'s update needs besides them (its fp32 values
    and gradients when they are not among the states). ``mode``: "free" or "demand". Uses the
    demand the manager tracked and the model budget of ``policy`` (the manager's)."""
    demand = manager.books.demand
    if not demand or mode not in ("free", "demand"):
        return StatePlan(0, (), 0)
    col = 1 if mode == "free" else 0
    cap = manager.books.tiers[ACC].capacity_bytes
    trainable = [g.param for g in manager.groups.values() if not g.param.frozen]

    def room(moment: int) -> int:
        return min(cap, policy.model_budget(cap, moment))

    n = max(demand) + 1
    slack = min(room(m) - demand.get(m, (0, 0))[col] for m in range(n))
    at_step = room(n) - sum(  # the optimizer runs after the last moment (wrapping around)
        s.shard_bytes for c in trainable for s in states_of(c) if s.tier is ACC
    )
    budget = max(0, slack)
    chosen: list[int] = []
    used = widest = 0
    for c in trainable:  # frozen chunks have no states
        states = states_of(c)
        if any(s.tier is ACC for s in states):
            continue
        cost = sum(s.shard_bytes for s in states)
        wide = max(widest, update_bytes(c))
        if used + cost > budget or used + cost + wide > at_step:
            break  # first-use order: later chunks are further from the optimizer moment
        chosen.append(c.chunk_id)
        used += cost
        widest = wide
    return StatePlan(budget, tuple(chosen), used)
