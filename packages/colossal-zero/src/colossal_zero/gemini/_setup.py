"""Building a Gemini chunk manager for a module: chunk size, budget checks, placement policy.

Everything here runs before the first step, so a budget that cannot work, an unknown placement
or precision is a ``ConfigError`` before any training starts.

[Note: wide tensors] The chunk-size search tries sizes from the largest tensor up to a bound
(the budget's, at most 2^25 elements). A model whose largest tensor is past that bound (a GPT of
width 5120: its MLP matrices have 104.9M elements) would get the largest tensor's size as its
only candidate, and greedy packing in module order then leaves chunks up to 2/3 empty (a block's
qkv and proj fill one chunk, each MLP matrix one more, with the next block's qkv spilling on).
The bound is raised to twice the largest tensor, within the budget's, so the search can find a
size a few thousand elements larger that packs a block into three full chunks.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence

import torch
import torch.distributed as dist

from colossal_chunk import (
    AutoPolicy,
    ChunkConfig,
    ChunkGroup,
    ChunkManager,
    ManagerHooks,
    StaticPolicy,
    pack,
    search_chunk_size,
    window_bytes,
)
from colossal_contracts import ConfigError, PlacementPolicy, TierName

from ..optim._precision import Precision
from ._config import GeminiConfig

__all__ = [
    "build_manager",
    "chunk_bytes_per_param",
    "chunk_numels",
    "gemini_chunk_numel",
    "gemini_num_chunks",
    "read_ahead_bytes",
    "working_set_bytes",
]

_MAX_DEFAULT_CHUNK = 1 << 25  # elements per chunk when no budget bounds it (64 MiB in bf16)
_MIN_CHUNKS = 4  # with no budget, the search stays below total / _MIN_CHUNKS elements per chunk
_SHARDED_SLACK = 0.15  # sharded chunks: waste traded for fewer chunks ([Note: fewer chunks])


def chunk_bytes_per_param(precision: str | Precision, *, frozen: bool = False) -> int:
    """Chunk bytes one parameter costs in Gemini (over all ranks together, padding aside). A
    trainable one: its value in the compute dtype, its fp32 master (low precision; its gradient
    reuses the parameter's slot) or fp32 gradient chunk (fp32), and Adam's two fp32 moments:
    14 in bf16/fp16, 16 in fp32. A frozen one (``requires_grad=False``): its value only, 2 or 4
    (colossal-chunk's [Note: frozen chunks]). Divide by the data-parallel size for one rank."""
    spec = Precision.parse(precision)
    value, state = spec.param_dtype.itemsize, spec.state_dtype.itemsize
    return value if frozen else value + 3 * state  # fp64: 32 ([Note: fp64 precision])


def chunk_numels(groups: Mapping[int, ChunkGroup]) -> tuple[int, int]:
    """The trainable and the frozen chunk size in force (elements), read off the chunks in
    ``groups`` (a manager's records): every parameter chunk of a kind holds its kind's size,
    rounded to the world size (``ChunkConfig.chunk_numel_for``; colossal-chunk's [Note: chunk
    size per kind]), and a re-pack gives every chunk the new sizes. A kind without chunks takes
    the other's size (its value then sizes nothing)."""
    sizes = {g.param.frozen: g.param.capacity for g in groups.values()}
    if not sizes:
        raise ConfigError("no parameter chunks yet: register the parameters first")
    return sizes.get(False, sizes.get(True, 0)), sizes.get(True, sizes.get(False, 0))


def working_set_bytes(
    chunk_numel: int, precision: Precision, world_size: int, *, frozen: bool = False
) -> int:
    """Compute-tier bytes one chunk needs while in use: its shard and gathered buffer (one
    rank: the shard is the buffer); in fp32 also its gradient chunk's: on one rank a whole
    chunk, sharded only a shard, since gradients go into the gathered buffer ([Note: gradients
    in chunks] in ``_collect.py``). A frozen chunk has no gradient chunk."""
    elem = torch.empty((), dtype=precision.param_dtype).element_size()
    shard = chunk_numel // world_size * elem
    one = chunk_numel * elem + (shard if world_size > 1 else 0)
    if precision.master or frozen:
        return one
    return one + (shard if world_size > 1 else chunk_numel * elem)


def _chunk_numel(
    numels: Sequence[int],
    config: GeminiConfig,
    precision: Precision,
    world_size: int,
    *,
    frozen: bool = False,
) -> int:
    """The chunk size for ``numels``, the trainable or (``frozen``) the frozen parameters'
    sizes: the configured one, else searched ([Note: chunk size per kind] in colossal-chunk)."""
    elem = torch.empty((), dtype=precision.param_dtype).element_size()
    largest = max(numels)
    unit = 1024 * world_size
    given, field = config.chunk_numel, "chunk_numel"
    if frozen and (config.frozen_chunk_numel is not None or given is not None):
        given = config.frozen_chunk_numel or given
        field = "frozen_chunk_numel" if config.frozen_chunk_numel else field
    if given is not None:
        n = -(-given // world_size) * world_size
        if n < largest:
            raise ConfigError(
                f"{field}={given:,} is smaller than the largest "
                f"{'frozen ' if frozen else ''}parameter ({largest:,} elements); raise "
                f"{field} or leave it None to search"
            )
        return n
    slack = 0.0
    if config.accelerator_bytes is None:
        # no budget: at least _MIN_CHUNKS chunks (so gathers can run ahead of compute), and
        # the size with least padding below that ([Note: packing] leaves a chunk's tail empty
        # when the next tensor does not fit: a bound at the largest tensor wastes ~40%); when
        # sharded, the fewest chunks within _SHARDED_SLACK of that waste: each costs two
        # all-gathers and a reduce-scatter per step (colossal-chunk's [Note: fewer chunks])
        cap_numel = sum(numels) // _MIN_CHUNKS
        slack = _SHARDED_SLACK if world_size > 1 else 0.0
    else:  # the part of the budget chunks may use
        cap = max(0, config.accelerator_bytes - config.non_model_bytes)
        if world_size == 1:
            # two working sets (an operator may read tensors of two chunks, and the next
            # chunk comes in while one computes) should fit in the budget (smaller chunks, to
            # leave room for states, cost padding when a tensor nearly fills one)
            cap_numel = cap // (2 * working_set_bytes(1, precision, 1, frozen=frozen))
        else:
            # sharded: one chunk in use and the next one's gathered buffer should fit (its
            # shard is gathered straight from the host when there is no room for it, and two
            # chunks read by one operator need only their buffers); and the fewest chunks
            # within _SHARDED_SLACK of the least waste, as with no budget: GPT tiny under a
            # quarter of its resident bytes, 13 chunks step at 1.05x FSDP2 with CPU offload
            # on 4 ranks, 7 at 0.93 ([Note: fewer chunks] in colossal-chunk). A tied head's
            # chunk takes no third place in backward: [Note: released after backward]
            per_elem = working_set_bytes(world_size, precision, world_size, frozen=frozen)
            cap_numel = int(cap // (per_elem / world_size + elem))
            slack = _SHARDED_SLACK
    # a tensor above the default bound: up to twice it, or the search has one candidate (the
    # tensor's own size) and wastes up to 2/3 of a wide GPT's chunks ([Note: wide tensors])
    ceiling = max(_MAX_DEFAULT_CHUNK, 2 * largest)
    limit = max(min(cap_numel, ceiling), -(-largest // unit) * unit)
    return _search(tuple(numels), max(limit, unit), elem, world_size, slack)


@functools.lru_cache(maxsize=64)
def _search(numels: tuple[int, ...], limit: int, elem: int, world_size: int, slack: float) -> int:
    """``search_chunk_size``'s choice, remembered: a planner asks for the same sizes under
    many budgets whose limits agree."""
    result = search_chunk_size(
        numels, max_numel=limit, element_size=elem, world_size=world_size, slack=slack
    )
    return result.chunk_numel


def gemini_chunk_numel(
    numels: Sequence[int], config: GeminiConfig, world_size: int = 1, *, frozen: bool = False
) -> int:
    """The chunk size ``build_manager`` picks for parameters of ``numels`` elements (in
    registration order) under ``config`` over ``world_size`` data-parallel ranks, the trainable
    or (``frozen``) the frozen ones' ([Note: chunk size per kind] in colossal-chunk): what a
    planner counts Gemini's chunks with, so that it cannot disagree with the runtime."""
    if not numels:
        raise ConfigError("gemini_chunk_numel needs the parameters' sizes; got none")
    return _chunk_numel(numels, config, config.precision_spec, world_size, frozen=frozen)


def gemini_num_chunks(numels: Sequence[int], chunk_numel: int) -> int:
    """Chunks of ``chunk_numel`` elements that parameters of ``numels`` elements (registered
    together, in this order) fill: colossal-chunk's packing, a tensor never split."""
    return len(pack(numels, chunk_numel))


def read_ahead_bytes(
    config: GeminiConfig,
    chunk_numel: int,
    world_size: int = 1,
    *,
    frozen_chunk_numel: int | None = None,
) -> int:
    """The host bytes ``build_manager``'s chunk manager reserves under ``config`` for disk pages
    read ahead (colossal-chunk's [Note: read-ahead window]) with chunks of ``chunk_numel``
    (frozen: ``frozen_chunk_numel``) elements over ``world_size`` ranks: what a planner takes
    out of the host budget. ``colossal_chunk.UNLIMITED`` without a host budget or disk tier."""
    cfg = ChunkConfig(
        chunk_numel=chunk_numel,
        frozen_chunk_numel=frozen_chunk_numel,
        host_bytes=config.host_bytes,
        disk_bytes=config.disk_bytes,
        read_ahead_bytes=config.read_ahead_bytes,
    )
    return window_bytes(cfg, world_size)


def _policy(config: GeminiConfig, total_param_bytes: int, working: int) -> PlacementPolicy:
    cap = config.accelerator_bytes
    if config.placement == "auto":
        share = 0.8
        if cap is not None and cap > 0:
            share = min(1.0, max(0.05, 1.0 - config.non_model_bytes / cap))
        # the loan: a warmup access that finds no room borrows; the feasibility rule decides
        # right after the warmup (_fit.py, [Note: warmup loan] in colossal-chunk)
        return AutoPolicy(warmup_share=share, margin=config.non_model_margin, warmup_loan=True)
    if cap is None or total_param_bytes == 0:
        return StaticPolicy(0.0, 1.0)
    room = max(0, cap - config.non_model_bytes - 2 * working)
    frac = min(1.0, max(0.0, 1.0 - room / total_param_bytes))
    return StaticPolicy(offload_param_frac=frac, offload_optim_frac=1.0)


def build_manager(
    named: Sequence[tuple[str, torch.nn.Parameter]],
    config: GeminiConfig,
    group: dist.ProcessGroup | None,
    hooks: ManagerHooks | None = None,
) -> tuple[ChunkManager, PlacementPolicy]:
    """A chunk manager sized for ``named`` (parameters already in the compute dtype), with the
    budget checked against the working set of one chunk, told and asked through ``hooks``, and
    the placement policy it was given (its owner feeds the policy what a warmup measured).
    Registers nothing yet."""
    precision = config.precision_spec
    world_size = dist.get_world_size(group) if group is not None else 1
    numels = [p.numel() for _, p in named]
    if not numels:
        raise ConfigError("the model has no parameters; Gemini has nothing to manage")
    # [Note: chunk size per kind] in colossal-chunk: each kind its own size (all trainable:
    # the one search over every parameter, as ever)
    trained = [p.numel() for _, p in named if p.requires_grad]
    frozen = [p.numel() for _, p in named if not p.requires_grad]
    chunk_numel = _chunk_numel(trained or numels, config, precision, world_size)
    frozen_numel = (
        _chunk_numel(frozen, config, precision, world_size, frozen=True) if frozen else None
    )
    working = working_set_bytes(chunk_numel, precision, world_size) if trained else 0
    if frozen_numel is not None:
        working = max(working, working_set_bytes(frozen_numel, precision, world_size, frozen=True))
    cap = config.accelerator_bytes
    usable = None if cap is None else cap - config.non_model_bytes
    if usable is not None and usable < working:
        raise ConfigError(
            f"accelerator budget of {cap:,} bytes (minus {config.non_model_bytes:,} reserved for "
            f"activations) cannot hold one chunk in use: a chunk of "
            f"{max(chunk_numel, frozen_numel or 0):,} "
            f"{precision.name} elements needs {working:,} bytes"
            f"{' with its fp32 gradient chunk' if not precision.master else ''}. Raise the "
            "accelerator budget, or lower chunk_numel (not below the largest parameter)"
        )
    elem = torch.empty((), dtype=precision.param_dtype).element_size()
    twins = 1 if precision.master else 2  # a gradient chunk beside each fp32 one
    param_bytes = -(-sum(trained) // chunk_numel) * twins * chunk_numel * elem // world_size
    if frozen_numel is not None:
        param_bytes += -(-sum(frozen) // frozen_numel) * frozen_numel * elem // world_size
    chunk_cfg = ChunkConfig(
        chunk_numel=chunk_numel,
        frozen_chunk_numel=frozen_numel,
        accelerator_bytes=cap,
        host_bytes=config.host_bytes,
        disk_bytes=config.disk_bytes,
        disk_dir=config.disk_dir,
        read_ahead_bytes=config.read_ahead_bytes,
        device=config.device,
        home=TierName.HOST.value,
    )
    policy = _policy(config, param_bytes, working)
    return ChunkManager(chunk_cfg, policy=policy, group=group, hooks=hooks), policy
