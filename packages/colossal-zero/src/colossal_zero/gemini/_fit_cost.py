"""What a chunk size costs one step under a budget: the fit's objective among the sizes it allows.

[Note: fit objective] On several ranks, among the chunk sizes that keep [Note: feasibility rule]
in ``_fit.py``, the fit takes the one whose step costs least:

    cost = collectives x (ws - 1) x COLLECTIVE_HOP_BYTES + moved

``collectives``: per step, one all-gather per run of consecutive moments that read a chunk and
one reduce-scatter per trainable chunk. ``moved``: the bytes Belady's MIN (the auto policy's
eviction: [Note: Belady eviction] in colossal-chunk) moves in the second of two replayed steps
when each moment needs its chunks' shards (in backward with their gradient twins' shards, made
there rather than loaded) resident in the room it leaves (the budget less its reserve, what kept
chunks hold and its chunks' gathered buffers), and every shard goes home for the update (as with
states on the host). The model is coarse (it over-counts by about a third) but ranks sizes as
measured moves do: GPT tiny and mini on 2 ranks at 0.6 of their states, over every size the rule
allows, rose and fell together with the measured bytes. Smaller chunks mean more collectives but
less held at each moment, so more room and fewer moves; halving (the choice before) took the
largest size on the halving ladder, often far more chunks than a size between two halvings (GPT
tiny on 4 ranks at 0.6 of its states: 9 where 7 keep the rule), while the fewest chunks alone
moves more (GPT mini on 2 ranks: 5 chunks moved 155 MB a step where 7 moved 141, and ran 4%
slower). Sizes below the first halving that keeps the rule are not tried: the replay
over-counts what smaller chunks save (stock GPT tiny on 2 ranks at a quarter of its resident
bytes: a step of 0.85 kept the rule where no halving did, 14 chunks where the run had gone on
with 6, and ran 9% slower). The choice is a pure function of the warmup's trace, the same on every rank. On one
rank there are no collectives and the fit keeps the largest size the rule allows on the halving
ladder (fewer chunks: fewer hooks and copies, which ``moved`` does not count).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from colossal_chunk.policies import simulate

__all__ = ["COLLECTIVE_HOP_BYTES", "StepCost", "step_cost"]

# What one hop of a collective (a ring all-gather or reduce-scatter on ``ws`` ranks has ``ws - 1``)
# costs beyond its bytes, counted as bytes moved between tiers: gloo on loopback with ranks
# sharing cores pays about a millisecond a hop, about what copying a MiB takes on the same cores.
COLLECTIVE_HOP_BYTES = 1 << 20


@dataclass(frozen=True)
class StepCost:
    """What one step costs with a layout ([Note: fit objective]).

    Attributes:
        collectives: all-gathers and reduce-scatters per step.
        moved: bytes moved between tiers per step (replayed, Belady).
        cost: ``collectives`` weighed in bytes plus ``moved``: what the fit minimises.
    """

    collectives: int
    moved: int
    cost: int


def step_cost(
    order: Sequence[tuple[str, ...]],
    backward_from: int,
    chunk_of: Mapping[str, int],
    chunk_bytes: Mapping[int, int],
    room: Sequence[int],
    *,
    ws: int,
    grad_twin: bool,
    frozen: Collection[int] = (),
) -> StepCost:
    """[Note: fit objective] for one layout. ``chunk_bytes``: a chunk's whole bytes (padding
    included); ``room``: per moment, the budget less its reserve and what kept chunks hold."""
    if ws < 2:
        raise ValueError(f"the fit objective counts collectives on several ranks, got ws={ws}")
    ids = [tuple(dict.fromkeys(chunk_of[n] for n in m if n in chunk_of)) for m in order]
    gathers = sum(1 for m, now in enumerate(ids) for c in now if m == 0 or c not in ids[m - 1])
    trainable = {c for c in chunk_bytes if c not in frozen}
    collectives = gathers + len(trainable)  # a reduce-scatter per trainable chunk
    twin = max(chunk_bytes, default=-1) + 1  # a gradient twin's id: its chunk's id + twin
    shard = {c: -(-b // ws) for c, b in chunk_bytes.items()}
    sizes = {**shard, **{c + twin: shard[c] for c in trainable}}
    steps: list[tuple[int, ...]] = []
    caps: list[int] = []
    for m, now in enumerate(ids):
        back = grad_twin and m >= backward_from
        step = (*now, *(c + twin for c in now if back and c in trainable))
        need = sum(sizes[c] for c in step)
        steps.append(step)
        caps.append(max(room[m] - sum(chunk_bytes[c] for c in now), need))
    steps.append(())  # the update: every shard goes home ([Note: fit objective])
    caps.append(0)
    made = {c for step in steps for c in step if c >= twin}  # a twin is made there, not loaded
    moved = simulate(steps, sizes, caps, iterations=2).per_iteration[-1]
    moved -= sum(sizes[c] for c in made)
    return StepCost(collectives, moved, collectives * (ws - 1) * COLLECTIVE_HOP_BYTES + moved)
