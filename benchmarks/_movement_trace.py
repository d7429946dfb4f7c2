"""The access trace of ``bench_movement``: a GPT preset traced on the meta device, its parameters
packed into chunks in first-use order with the optimizer states' twin chunks, one iteration's
per-moment chunk accesses (and writes), the activations' bytes per moment, and the trace
replayed on a real ``ChunkManager``."""

from __future__ import annotations

import dataclasses

import torch

from colossal_chunk import AutoPolicy, ChunkConfig, ChunkManager, pack, search_chunk_size
from colossal_chunk.policies import trace_order
from colossal_models import GPT, GPTConfig

ITERATIONS = 8  # steady state = mean of iterations 2..7 (the first is cold, the last has no future)
STATE_KINDS = ("master", "exp_avg", "exp_avg_sq")  # gradients: in the parameter chunk's slots
BYTES = {"param": 2, "master": 4, "exp_avg": 4, "exp_avg_sq": 4}  # mixed precision
ACT_BATCH, ACT_SEQ = 2, 256  # the activations of the "with activations" rows


def _activations(cfg, n_order: int, n_steps: int) -> list[int]:
    """Non-model bytes per step: saved activations (16-bit, no recomputation; Korthikanti et
    al. 2022: s*b*h*34 + 5*a*s^2*b per layer) grow through forward and shrink through backward."""
    s, b, h, a = ACT_SEQ, ACT_BATCH, cfg.hidden_size, cfg.num_heads
    peak = cfg.num_layers * (s * b * h * 34 + 5 * a * s * s * b)
    half = n_order // 2
    out = [peak * (m + 1) // half for m in range(half)]
    out += [peak * (n_order - m) // half for m in range(half, n_order)]
    return out + [0] * (n_steps - n_order)


def _trace(preset: str):
    cfg = dataclasses.replace(GPTConfig.preset(preset), vocab_size=256)
    with torch.device("meta"):
        model = GPT(cfg)
    idx = torch.zeros(1, min(cfg.max_seq_len, 16), dtype=torch.long, device="meta")
    order = trace_order(model, lambda: model(idx, idx))
    numel = {n: p.numel() for n, p in model.named_parameters()}
    names = list(dict.fromkeys(n for m in order for n in m))
    return cfg, order, names, numel


def _layout(order, names, numel):
    """Chunk size, per-chunk sizes/kinds, and the per-moment access steps of one iteration."""
    numels = [numel[n] for n in names]
    total = sum(numels)
    # the optimizer step's working set (14 bytes per element of one chunk) takes at most a
    # quarter of the smallest budget (25% of 14 bytes per parameter)
    limit = max(total // 16, 2 * max(numels))
    found = search_chunk_size(numels, max_numel=limit, align=1024)
    groups = pack(numels, found.chunk_numel)
    chunk_of = {names[i]: c for c, g in enumerate(groups) for i in g}
    n = len(groups)
    kinds = ["param"] * n + [k for k in STATE_KINDS for _ in range(n)]
    sizes = [BYTES[k] * found.chunk_numel for k in kinds]

    def twin(kind: str, c: int) -> int:
        return (1 + STATE_KINDS.index(kind)) * n + c

    steps = [tuple(dict.fromkeys(chunk_of[x] for x in used)) for used in order]
    steps += [(c, *(twin(k, c) for k in STATE_KINDS)) for c in range(n)]
    return found, kinds, sizes, steps


def _steady(per_iteration) -> float:
    mid = per_iteration[1:-1]
    return sum(mid) / len(mid)


def _manager_replay(kinds, sizes, steps, chunk_numel, capacity, schedule) -> float:
    """Replay the trace on a real ChunkManager (emulated accelerator) with the auto policy."""
    n = kinds.count("param")
    params = [
        (
            f"c{i}",
            torch.nn.Parameter(torch.zeros(chunk_numel, dtype=torch.float16), requires_grad=False),
        )
        for i in range(n)
    ]
    policy = AutoPolicy()
    cfg = ChunkConfig(chunk_numel, accelerator_bytes=capacity, device="cpu", disk_bytes=0)
    with ChunkManager(cfg, policy=policy) as mgr:
        mgr.register(params)
        for kind in STATE_KINDS:
            mgr.add_parallel(kind, torch.float32)
        assert [c.shard_bytes for c in mgr.chunks.values()] == sizes
        policy.set_schedule(schedule)
        per_iter = []
        for _ in range(ITERATIONS):
            mgr.books.reset_stats()
            for m, step in enumerate(steps):
                mgr.set_moment(m)
                mgr.access(step)
                mgr.release(step)
            per_iter.append(mgr.books.stats().bytes_moved)
    return _steady(per_iter)


def _written(steps, n_order: int) -> list[tuple[int, ...]]:
    """The chunks each step writes: none in forward (parameters are read), the parameter chunks
    in backward (gradients go into their slots), every chunk at the optimizer step."""
    return [() if m < n_order // 2 else st for m, st in enumerate(steps)]
