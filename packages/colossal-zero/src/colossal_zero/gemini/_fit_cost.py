"""What a chunk size costs one step under a budget: the fit's objective among the sizes it allows.

[Note: fit objective] On several ranks, of the chunk sizes between the current one and the
halving after the first halving that keeps [Note: feasibility rule] (``_fit.py``) that keep it,
each made tight ([Note: tight sizes]), the fit takes the one whose step costs least:

    cost = collectives x (ws - 1) x COLLECTIVE_HOP_BYTES + moved + exposed

``collectives``: per step, one all-gather per run of consecutive moments that read a chunk and
one reduce-scatter per trainable chunk. ``moved``: the bytes Belady's MIN (the auto policy's
eviction: [Note: Belady eviction] in colossal-chunk) moves in the second of two replayed steps
when each moment needs its chunks' shards (in backward with their gradient twins' shards, made
there rather than loaded) resident in the room it leaves (the budget less its reserve, what kept
chunks hold and its chunks' gathered buffers), and every shard goes home for the update (as with
states on the host); over every size the rule allowed GPT tiny and mini, measured moves rose and
fell with it. ``exposed``: the bytes on the wire no compute overlaps: of each collective, this
rank's ``(ws - 1) / ws`` of its chunk beyond ``OVERLAP_BYTES``, and all of the first moment's
all-gathers and the last one's reductions ([Note: overlap] in ``_comm.py``). Bigger chunks:
fewer collectives, more held at each moment (less room, more moves) and more exposed. Halving
alone takes the largest size on the halving ladder, often far more chunks than a size between
two halvings; the fewest chunks alone waits on big gathers (``exposed``). Sizes below the next
halving are not tried: there the replay over-counts what smaller chunks save (a size of 0.85
steps that kept the rule where no halving did took 14 chunks where the run had gone on with 6,
and was slower). Down to the first halving only, a stock-module GPT mini on 2 ranks under a
quarter of its resident bytes took 18 chunks of 1,576,960 elements, a third of each padding
(a stock ``nn.TransformerEncoderLayer``'s three 1M-element matrices do not go two to a chunk),
where 19 of 1,183,744 cost less by this objective and stepped faster. The choice is a pure function of the warmup's trace, the same on every rank. On
one rank there are no collectives and the fit takes that halving (fewer chunks: fewer hooks and
copies, which ``moved`` does not count). Measurements: docs/gemini.md, Figures.

[Note: tight sizes] Tensors are packed whole and in order (colossal-chunk's [Note: packing]), so
a chunk size ``n`` and the fullest chunk's elements rounded up to ``1024 x ws`` (the size's
unit) pack every tensor into the same chunk: the smaller size's chunks hold the same tensors with
less padding, so every moment holds fewer bytes (the rule's need only falls), and gathers,
reductions and moves carry fewer. The fit takes each candidate at its tight size.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from colossal_chunk.policies import simulate
from colossal_contracts import ConfigError

__all__ = ["COLLECTIVE_HOP_BYTES", "OVERLAP_BYTES", "StepCost", "step_cost"]

# What one hop of a collective (a ring all-gather or reduce-scatter on ``ws`` ranks has ``ws - 1``)
# costs beyond its bytes, counted as bytes moved between tiers: gloo on loopback with ranks
# sharing cores pays about a millisecond a hop, about what copying a MiB takes on the same cores.
COLLECTIVE_HOP_BYTES = 1 << 20
# What of a collective's bytes on the wire the compute of the moment before its use hides: a
# moment is one operator, so a chunk whose share is larger waits (GPT mini on 2 ranks with 5
# chunks of 19 MB waited 2.5x as long in its pre-forward and pre-backward hooks as with 7 of 13).
# Set where GPT mini's measured steps turn: fewer chunks with shares up to about 6 MiB sped its
# step up, fewer with shares of 8-10 MiB slowed it (docs/gemini.md, Figures).
OVERLAP_BYTES = 6 << 20


@dataclass(frozen=True)
class StepCost:
    """What one step costs with a layout ([Note: fit objective]).

    Attributes:
        collectives: all-gathers and reduce-scatters per step.
        moved: bytes moved between tiers per step (replayed, Belady).
        exposed: bytes on the wire that no compute overlaps: of each collective, this rank's
            share beyond ``OVERLAP_BYTES``, and all of the first moment's all-gathers and of
            the last moment's reduce-scatters.
        cost: ``collectives`` weighed in bytes plus ``moved`` and ``exposed``: what the fit
            minimises.
    """

    collectives: int
    moved: int
    exposed: int
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
        raise ConfigError(f"the fit objective counts collectives on several ranks, got ws={ws}")
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
    # a collective's wire bytes beyond what a moment's compute hides are exposed; nothing hides
    # the first moment's all-gathers nor the last moment's reduce-scatters
    wire = {c: b * (ws - 1) // ws for c, b in chunk_bytes.items()}
    runs = [c for m, now in enumerate(ids) for c in now if m > 0 and c not in ids[m - 1]]
    ends = [*(ids[0] if ids else ()), *(c for c in (ids[-1] if ids else ()) if c in trainable)]
    rest = [*runs, *(c for c in trainable if c not in ends)]
    exposed = sum(wire[c] for c in ends) + sum(max(0, wire[c] - OVERLAP_BYTES) for c in rest)
    cost = collectives * (ws - 1) * COLLECTIVE_HOP_BYTES + moved + exposed
    return StepCost(collectives, moved, exposed, cost)
