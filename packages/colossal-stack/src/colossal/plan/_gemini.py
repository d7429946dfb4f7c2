"""Gemini's chunks as its runtime lays them out, counted for the planner's memory model.

[Note: gemini chunks] Gemini packs the parameters, in registration order, into chunks of one
size that colossal-zero chooses (``colossal_zero.gemini_chunk_numel``, the same search
``apply_gemini`` runs, so the two cannot disagree) and shards each over the data-parallel ranks.
One rank holds, per chunk, its shard (``numel / dp`` elements, padding included) of the
parameters and, per trainable chunk, of the reduced gradients (fp32: a gradient twin; bf16: the
fp32 masters) and of Adam's two fp32 moments. On more than one rank a chunk in use is gathered
into a whole buffer; with overlap (the default) the chunks of the moment after the current one
are gathered ahead and one the next moment reads again stays gathered, so up to
``GATHERED_IN_FLIGHT`` whole chunks are gathered at once (measured on 4 ranks, GPT 4x128 in five
chunks: three at the peak). On one rank the shard is the buffer: nothing is gathered. A move
between tiers keeps the payload it freed for the next move of its size (colossal-chunk's
[Note: spare payloads]): one parameter shard lives on the host beside the tiers' books (the fp32
masters and moments are made where they stay); shards under 8 MiB keep up to 8 MiB of spares
when several moves are in flight, not counted here (at most 8 MiB).

The tiers' accelerator budget (``colossal train --layout``'s, [Note: layout flags]) is
``tier_budget`` of the layout's predicted peak, and the chunk size the runtime picks depends on
that budget, while the peak depends on the chunk size; the planner takes the largest chunk size
that is its own budget's choice (iterating down from the size with no budget), the budget the job
then passes. The job keeps the planned activations free of chunks (``non_model_bytes``). Where
the tiers put the parameters off the accelerator, the chunks in flight bring their parameter
shards there ([Note: gemini tiers] in ``_gemini_tiers``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from colossal_zero import GeminiConfig, gemini_chunk_numel, gemini_num_chunks

from ._layout import Layout
from ._shape import ModelShape

__all__ = [
    "GATHERED_IN_FLIGHT",
    "GeminiBytes",
    "gemini_bytes",
    "param_numels",
    "tier_budget",
]

GATHERED_IN_FLIGHT = 3  # in use, kept for the next moment, gathered ahead (see the note)
ROOM = 2.0  # tier budgets over the predicted bytes (chunks round tensors up to whole chunks)
MIN_BUDGET = 16 << 20
_UNBOUNDED = 1 << 60  # "no budget" for a search that must start from the largest chunk
_ITERATIONS = 8


def tier_budget(nbytes: float) -> int:
    """The byte budget ``colossal train --layout`` gives a Gemini tier of ``nbytes`` planned."""
    return max(MIN_BUDGET, int(nbytes * ROOM))


def _block_tensors(shape: ModelShape, small: float) -> list[float]:
    """One block's parameters: GPT's in its module order when ``small`` (the block's vectors)
    is GPT's ``13 h``, else the four matrices with the vectors in two halves around them."""
    h, ffn = shape.hidden, shape.ffn or 4 * shape.hidden
    kv = (shape.kv_heads or shape.heads) * (h // shape.heads)
    qkv, proj = h * (h + 2 * kv), h * h
    fc, fc2 = h * ffn * (2 if shape.gated else 1), ffn * h
    if small == 13 * h and not shape.gated:  # GPT with biases
        return [h, h, qkv, 3 * h, proj, h, h, h, fc, ffn, fc2, h]
    if shape.gated:  # PaLM/Llama: separate q, k, v and gate, up projections
        return [small / 2, h * h, h * kv, h * kv, proj, small - small / 2, fc / 2, fc / 2, fc2]
    return [small / 2, qkv, proj, small - small / 2, fc, fc2]


def param_numels(shape: ModelShape, lay: Layout) -> tuple[int, ...]:
    """Elements of each parameter one tensor-parallel rank registers, in module order: the
    embeddings, each block's, the final norm, an untied head, then a LoRA run's adapters (one
    group per block). Exact for colossal-models' GPT; other shapes get each block's four
    matrices with its vectors around them."""
    h, vocab = shape.hidden, shape.vocab
    base = shape.frozen or shape.params  # a LoRA run's frozen base is the model
    extra = shape.embed_params - vocab * h  # learned positions, or an untied head
    head_at_end = extra == vocab * h and (shape.gated or extra != shape.max_positions * h)
    out: list[float] = [vocab * h] + ([extra] if extra and not head_at_end else [])
    mats = sum(_block_tensors(shape, 0.0))
    vectors = base - shape.embed_params - shape.layers * mats  # norms and biases
    final = next((f for f in (2 * h, h) if (vectors - f) % (shape.layers * h) == 0), 0)
    for _ in range(shape.layers):
        out.extend(_block_tensors(shape, max(0.0, (vectors - final) / shape.layers)))
    out.extend([h] * (final // h))  # the final norm's weight (and bias)
    out.append(base - sum(out) - (extra if head_at_end else 0))  # 0 for the shapes above
    if head_at_end:
        out.append(extra)
    if shape.frozen:
        out.extend([(shape.params - shape.frozen) / shape.layers] * shape.layers)
    if lay.tp > 1:  # 1D splits the matrices only, the grid modes every tensor
        split_all = lay.tp_mode not in ("1d", "1d-sp")
        out = [n / lay.tp if split_all or n >= h * h else n for n in out]
    return tuple(max(1, math.ceil(n)) for n in out if n > 0)


@lru_cache(maxsize=256)
def _chunk_numel(
    numels: tuple[int, ...], precision: str, budget: int | None, act: int, dp: int, frozen: bool
) -> int:
    cfg = GeminiConfig(precision=precision, accelerator_bytes=budget, non_model_bytes=act)
    return gemini_chunk_numel(numels, cfg, dp, frozen=frozen)


def _sizes(
    numels: tuple[int, ...], frozen_n: int, precision: str, budget: int | None, act: int, dp: int
) -> tuple[int, int]:
    """(trainable, frozen) chunk sizes as ``build_manager`` searches them apart ([Note: chunk
    size per kind] in colossal-chunk); the frozen one 0 without frozen parameters (the
    ``frozen_n`` adapters at the end of ``numels`` are the trainable ones then)."""
    if not frozen_n:
        return _chunk_numel(numels, precision, budget, act, dp, False), 0
    base, adapters = numels[: len(numels) - frozen_n], numels[len(numels) - frozen_n :]
    return (
        _chunk_numel(adapters, precision, budget, act, dp, False),
        _chunk_numel(base, precision, budget, act, dp, True),
    )


@dataclass(frozen=True)
class GeminiBytes:
    """One rank's Gemini bytes by kind (see [Note: gemini chunks]).

    Attributes:
        chunk_numel, num_chunks: the runtime's (trainable) chunk size and parameter chunks
            (frozen among them: ``frozen_chunks``, of ``frozen_chunk_numel`` elements each).
        params: parameter shards; grads: fp32's gradient twins (0 in bf16: the masters count as
            ``optimizer``); optimizer: Adam's moments (and bf16's fp32 masters).
        gathered: whole chunks gathered at once; in_flight: the parameter shards of those
            chunks (of the chunks in use on one rank), on the accelerator at the peak;
        spare: the spare payload kept on the host.
        frozen: the part of ``params`` frozen chunks take.
    """

    chunk_numel: int
    num_chunks: int
    frozen_chunks: int
    frozen_chunk_numel: int
    params: float
    grads: float
    optimizer: float
    gathered: float
    spare: float
    frozen: float
    in_flight: float


def _count(
    numels: tuple[int, ...], sizes: tuple[int, int], lay: Layout, precision: str, frozen_n: int
):
    w = 4 if precision == "fp32" else 2
    c, cf = sizes
    base, adapters = numels[: len(numels) - frozen_n], numels[len(numels) - frozen_n :]
    if frozen_n:
        frozen, trainable = gemini_num_chunks(base, cf), gemini_num_chunks(adapters, c)
    else:
        frozen, trainable = 0, gemini_num_chunks(numels, c)
    shard, frozen_shard = c / lay.dp, cf / lay.dp
    total = frozen + trainable
    flying = min(GATHERED_IN_FLIGHT, total)
    gathered = flying * max(c, cf) * w if lay.dp > 1 else 0.0
    return GeminiBytes(
        c,
        total,
        frozen,
        cf,
        trainable * shard * w + frozen * frozen_shard * w,
        trainable * shard * 4 if precision == "fp32" else 0.0,
        trainable * shard * (8 if precision == "fp32" else 12),
        gathered,
        max(shard, frozen_shard) * w,
        frozen * frozen_shard * w,
        flying * max(shard, frozen_shard) * w,
    )


def gemini_bytes(shape: ModelShape, lay: Layout, precision: str, activations: float) -> GeminiBytes:
    """One rank's Gemini bytes under ``lay`` (see [Note: gemini chunks]); ``activations``: the
    planned activation bytes at the peak."""
    numels = param_numels(shape, lay)
    adapters = shape.layers if shape.frozen else 0
    prec = "fp32" if precision == "fp32" else "bf16"
    act = int(activations)
    if lay.method == "gemini":
        sizes = _sizes(numels, adapters, prec, None, 0, lay.dp)
        return _count(numels, sizes, lay, prec, adapters)
    sizes = _sizes(numels, adapters, prec, _UNBOUNDED, act, lay.dp)
    for _ in range(_ITERATIONS):
        b = _count(numels, sizes, lay, prec, adapters)
        device = b.params + b.grads if lay.method == "gemini-host" else b.in_flight
        budget = tier_budget(device + b.gathered + activations)
        nxt = _sizes(numels, adapters, prec, budget, act, lay.dp)
        if nxt[0] >= sizes[0] and nxt[1] >= sizes[1]:
            return b
        sizes = (min(nxt[0], sizes[0]), min(nxt[1], sizes[1]))
    return _count(numels, sizes, lay, prec, adapters)
