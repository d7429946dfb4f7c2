"""Fitting the chunk size to the accelerator budget once the warmup has measured the step.

[Note: feasibility rule] A budget trains with a chunk size when, at every moment ``m`` of the
traced step, the compute tier holds the model data that moment cannot do without beside the
non-model reserve of [Note: auto budget] (the measured peak over ``m`` and the next ``lookahead``
moments, raised by ``non_model_margin``, never clipped to the budget):

    need(m) = reserve(m) + held(m) + kept,   smallest budget = max over m of need(m)

``held(m)`` counts whole parameter chunks (a gathered buffer beside the shard when sharded) of
moment ``m`` and of ``m - 1`` (one is still in use as the next is accessed), and in backward the
gradient twins of moment ``m``'s trainable chunks when gradients have chunks of their own (a
frozen chunk has none: colossal-chunk's [Note: frozen chunks]). ``kept`` is what kept chunks hold
([Note: kept chunks] in colossal-chunk). Padding counts: a chunk holds ``chunk_numel`` elements.

The warmup itself always finishes: an access that finds no room borrows beyond the budget
([Note: warmup loan] in colossal-chunk), so the rule below decides with the whole step measured.
After the warmup, when the current chunk size breaks the rule, chunks are halved (never below the
largest tensor; frozen and trainable chunks, each of its own size: colossal-chunk's [Note: chunk
size per kind], are halved together, each not below its own kind's largest tensor) until one
size keeps it. On one rank that size is taken; on several ranks, of the sizes between it and
the current one (it, and steps of 0.85 from the current size) that keep the rule, the one
[Note: fit objective] (``_fit_cost.py``) finds cheapest. Either way the size taken keeps the
rule, and the run re-packs to it before the next step. When no halving keeps
it, the rule (an upper bound: it counts the previous moment's chunks and gradient twins that
a step may already have let go) does not refuse by itself: the run stops with a ``CapacityError``
only when even a moment's own chunks (in backward with the gradient twins still filling: those
of chunks whose gradients began at an earlier backward moment and end at or after this one; a
stock ``nn.MultiheadAttention`` reads parameters of three chunks in one moment, one of which
began filling its twin a moment before, and counting the chunks alone let a run go on that
failed in its second step) do not fit beside the moment's own measured non-model peak (no
margin, no lookahead: what no placement can do without) at the smallest size, naming the rule's budget at that size, which trains (on several ranks, where a gather ahead and
a reduction in flight hold two whole chunks more than the rule counts, that much more: GPT nano on
4 ranks named 934,623 bytes, 10 of 10 runs at it trained, integration test_budget_repeats; the
budget with every chunk resident, named before, was 1,395,101); otherwise it goes on
with the chosen size, and an access that finds no room names a budget as ``make_room`` does.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Collection, Mapping, Sequence

import torch

from colossal_chunk import ChunkManager, pack
from colossal_contracts import CapacityError, TierName

from ._fit_cost import StepCost, step_cost
from ._setup import chunk_numels

__all__ = ["RERUN_HEADROOM", "fit_chunk_size", "moment_need"]

# [Note: re-run headroom] The budget a refusal names is checked again by the run that follows it,
# against that run's own warmup, whose non-model peaks move from run to run (an unmodified HF
# GPT-2 on 2 ranks measured 3,142,982 then 3,213,937 bytes, +2.3%, and the rerun was refused with
# a larger figure in 1 of 3 tries; with 10% a clean CI run saw a rerun's reserve 3,287,153 bytes
# where its own warmup had named 4,006,657 in all). So the named budget holds this share of the
# largest reserve beyond the rule's need: a rerun whose peaks grow by less than it still trains.
# (Most of that growth was a released gathered buffer read as activations, now gone: colossal-
# chunk's [Note: books follow storage]; what remains is a buffer gloo's worker thread holds a
# moment past ``wait()``, up to one whole chunk at one moment: docs/gemini.md.)
RERUN_HEADROOM = 0.25


def moment_need(
    order: Sequence[tuple[str, ...]],
    backward_from: int,
    chunk_of: Mapping[str, int],
    chunk_bytes: Mapping[int, int],
    *,
    grad_twin: bool,
    frozen: Collection[int] = (),
) -> list[int]:
    """``held(m)`` of [Note: feasibility rule] for every moment of ``order``; ``frozen``: the
    chunk numbers of frozen chunks (no gradient twin)."""
    need = []
    for m, names in enumerate(order):
        now = {chunk_of[n] for n in names if n in chunk_of}
        ids = now | ({chunk_of[n] for n in order[m - 1] if n in chunk_of} if m > 0 else set())
        twins = now.difference(frozen) if grad_twin and m >= backward_from else set()
        need.append(sum(chunk_bytes[c] for c in ids) + sum(chunk_bytes[c] for c in twins))
    return need


_Tensor = tuple[int, torch.dtype, bool]  # elements, dtype, frozen


def _layout(
    names: Sequence[str], tensors: Mapping[str, _Tensor], sizes: tuple[int, int]
) -> dict[str, int]:
    """Parameter name -> chunk number, packed as ``register`` packs them (one run per dtype,
    frozen tensors apart); ``sizes``: the trainable and the frozen chunk size."""
    chunk_of: dict[str, int] = {}
    base = 0
    for key in dict.fromkeys(tensors[n][1:] for n in names):
        group = [n for n in names if tensors[n][1:] == key]
        packed = pack([tensors[n][0] for n in group], sizes[key[1]])
        for i, idx in enumerate(packed):
            for j in idx:
                chunk_of[group[j]] = base + i
        base += len(packed)
    return chunk_of


def _tight(
    names: Sequence[str], tensors: Mapping[str, _Tensor], sizes: tuple[int, int], ws: int
) -> tuple[int, int]:
    """The smallest (trainable, frozen) sizes that pack as ``sizes`` do ([Note: tight sizes] in
    ``_fit_cost.py``): per kind, its fullest chunk's elements rounded up to ``1024 * ws``."""
    used: dict[int, int] = {}
    kind_of: dict[int, bool] = {}
    for n, c in _layout(names, tensors, sizes).items():
        used[c] = used.get(c, 0) + tensors[n][0]
        kind_of[c] = tensors[n][2]
    unit = 1024 * ws

    def one(kind: bool) -> int:
        fullest = max((u for c, u in used.items() if kind_of[c] is kind), default=None)
        return sizes[kind] if fullest is None else min(sizes[kind], -(-fullest // unit) * unit)

    return one(False), one(True)


def _ladder(
    numels: tuple[int, int], largest: Sequence[int], ws: int, *, halving_only: bool = False
) -> list[tuple[int, int]]:
    """The (trainable, frozen) chunk sizes below ``numels`` the fit tries, largest first: every
    halving, and steps of 0.85 (at least one rounding unit each), each rounded up to a multiple
    of ``1024 * ws`` elements and not below its kind's largest tensor; both ladders end at the
    same smallest size."""
    unit = 1024 * ws

    def halved(n: int, big: int) -> int:
        return min(max(-(-(n // 2) // unit) * unit, -(-big // ws) * ws), n)

    def stepped(n: int, big: int) -> int:
        return min(max(min(-(-(n * 17 // 20) // unit) * unit, n - unit), -(-big // ws) * ws), n)

    out: set[tuple[int, int]] = set()
    for step in (halved,) if halving_only else (halved, stepped):
        cur = numels
        while True:
            nxt = (step(cur[0], largest[0]), step(cur[1], largest[1]))
            if nxt == cur:
                break
            out.add(nxt)
            cur = nxt
    return sorted(out, reverse=True)


def fit_chunk_size(
    manager: ChunkManager,
    reserve: Callable[[int], int],
    order: Sequence[tuple[str, ...]],
    backward_from: int,
    packing: Sequence[str],
    ws: int,
    grad_twin: bool,
    *,
    peak: Callable[[int], int] | None = None,
) -> dict[str, int] | None:
    """Apply [Note: feasibility rule]: keep the chunk size (None), or return smaller sizes as
    ``ChunkManager.repack``'s keywords (the caller re-packs with them before the next step), or
    raise ``CapacityError``.
    ``packing``: every parameter name in the order a re-pack packs them; ``ws``: the manager's
    world size; ``grad_twin``: gradients have chunks of their own; ``peak``: a moment's own
    measured non-model peak (no margin, no lookahead), what the floor counts (None: ``reserve``)."""
    capacity = manager.books.tiers[TierName.ACCELERATOR].capacity_bytes
    tensors = {  # name -> (elements, dtype, frozen): from the records (sharded ones look empty)
        n: (math.prod(r.shape), g.param.dtype, g.param.frozen)
        for g in manager.groups.values()
        for n, r in g.param.records.items()
    }
    names = [n for n in packing if n in tensors]
    kept = manager.books.kept_bytes()
    reserves = [reserve(m) for m in range(len(order))]
    peaks = reserves if peak is None else [peak(m) for m in range(len(order))]
    numels = chunk_numels(manager.groups)  # the sizes in force, each rounded to ``ws``
    # per kind: the size it may not go below (its largest tensor; a kind without tensors stays)
    largest = [
        max((t[0] for t in tensors.values() if t[2] == kind), default=numels[kind])
        for kind in (False, True)
    ]

    @functools.cache  # the objective asks again for sizes the halvings measured
    def budgets(numels: tuple[int, int]) -> tuple[int, int]:
        """The rule's smallest budget, and the floor below which the policy cannot place a
        moment's own chunks (in backward with the gradient twins still filling) beside its
        reserve at all."""
        chunk_of = _layout(names, tensors, numels)
        sizes = {}
        for n, c in chunk_of.items():
            b = numels[tensors[n][2]] * tensors[n][1].itemsize
            sizes[c] = b // ws + (b if ws > 1 else 0)
        frozen = {c for n, c in chunk_of.items() if tensors[n][2]}
        held = moment_need(
            order, backward_from, chunk_of, sizes, grad_twin=grad_twin, frozen=frozen
        )
        # a moment's own chunks and, in backward, the gradient twins still filling: a parameter's
        # gradient is collected at its last backward moment ([Note: gradients in parts]), and a
        # chunk's twin fills from its first parameter's gradient to its last one's
        arrives: dict[str, int] = {}
        for i in range(backward_from, len(order)) if grad_twin else ():
            arrives.update((n, i) for n in order[i] if n in chunk_of)
        first: dict[int, int] = {}
        last: dict[int, int] = {}
        for n, i in sorted(arrives.items(), key=lambda kv: kv[1]):
            c = chunk_of[n]
            if c not in frozen:
                first.setdefault(c, i)
                last[c] = i
        own = []
        for i, m in enumerate(order):
            now = {chunk_of[n] for n in m if n in chunk_of}
            filling = [c for c in first if first[c] < i <= last[c]]
            own.append(sum(sizes[c] for c in now) + sum(sizes[c] for c in filling))
        rule = max(r + h for r, h in zip(reserves, held, strict=True)) + kept
        return rule, max(r + h for r, h in zip(peaks, own, strict=True)) + kept

    def _cost(numels: tuple[int, int]) -> StepCost:
        """[Note: fit objective] of the layout with chunk sizes ``numels``."""
        chunk_of = _layout(names, tensors, numels)
        whole = {c: numels[tensors[n][2]] * tensors[n][1].itemsize for n, c in chunk_of.items()}
        frozen = {c for n, c in chunk_of.items() if tensors[n][2]}
        room = [capacity - r - kept for r in reserves]
        return step_cost(
            order, backward_from, chunk_of, whole, room, ws=ws, grad_twin=grad_twin, frozen=frozen
        )

    need, floor = budgets(numels)
    if need <= capacity:
        return None
    halvings = _ladder(numels, largest, ws, halving_only=True)
    # when none keeps the rule, the smallest size's figures stay
    for i, cand in enumerate(halvings):
        need, floor = budgets(cand)
        if need <= capacity:
            if ws > 1:  # [Note: fit objective]: the cheapest size down to the next halving
                low = halvings[i + 1] if i + 1 < len(halvings) else cand
                keeping = {
                    _tight(names, tensors, c, ws)
                    for c in _ladder(numels, largest, ws)
                    if c[0] >= low[0] and c[1] >= low[1] and budgets(c)[0] <= capacity
                }
                # a tie: the larger size
                cand = min(sorted(keeping, reverse=True), key=lambda c: _cost(c).cost)
            kinds = {t[2] for t in tensors.values()}  # the sizes of the kinds there are
            sizes = {"chunk_numel": cand[0]} if False in kinds else {}
            return sizes | ({"frozen_chunk_numel": cand[1]} if True in kinds else {})
    numels = halvings[-1] if halvings else numels
    if floor <= capacity:  # the rule counts more than may be held: try the chosen size
        return None
    numel = max(numels[k] for k in {t[2] for t in tensors.values()})  # of the kinds there are
    if ws > 1:  # a gather ahead and a reduction in flight: two whole chunks more than the rule
        need += 2 * numel * max(t[1].itemsize for t in tensors.values())
    need += math.ceil(RERUN_HEADROOM * max(reserves))  # [Note: re-run headroom]
    raise CapacityError(
        f"the accelerator budget of {capacity:,} bytes cannot train this model: the warmup "
        f"measured non-model peaks of up to {max(reserves):,} bytes (with the safety margin) and "
        f"even chunks of {numel:,} elements (the largest tensor's size) need {need:,} bytes at "
        f"some moment (docs/gemini.md, feasibility rule). Raise the accelerator budget to at "
        f"least {need:,} bytes ({need / 2**20:,.1f} MiB), or shorten the batch or sequence"
    )
