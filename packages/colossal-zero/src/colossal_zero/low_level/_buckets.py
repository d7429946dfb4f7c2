"""Flat per-rank buckets of ZeRO-1/2, built from colossal-chunk's ``Chunk``.

[Note: zero buckets] Trainable parameters are packed, in reverse registration order (roughly
the order backward produces their gradients), into buckets of ``bucket_numel`` elements. A
bucket is a set of chunks with one layout, sharded over the data-parallel group:

- ``param`` (compute dtype): its gathered buffer ``flat`` *is* the parameters' storage (every
  parameter is a view into it) and stays gathered; the shard is a view of this rank's slice of
  ``flat``. After the optimizer step the rank writes its slice and all-gathers ``flat`` in place.
- ``grad`` (compute dtype): stage 1 keeps a whole gradient buffer (``.grad`` of every parameter
  is a view into it; its shard is a view of this rank's slice); stage 2 keeps only the shard and
  gathers each backward's gradients into a fresh buffer that is reduce-scattered and dropped.
- ``master`` (fp32, with low-precision parameters or an offloaded optimizer), ``exp_avg`` and
  ``exp_avg_sq`` (fp32): shards only, on the optimizer's device. Under fp64 these three are
  float64 (the precision's ``state_dtype``: [Note: fp64 precision]).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from colossal_chunk import Chunk

__all__ = ["Bucket", "build_buckets"]


@dataclass
class Bucket:
    """The chunks of one bucket (see [Note: zero buckets]).

    Attributes:
        param: compute-dtype parameter chunk; ``flat`` is its gathered buffer.
        grad: compute-dtype gradient chunk (same layout).
        master: fp32 master chunk, or None when the parameter shard itself is updated.
        exp_avg, exp_avg_sq: Adam's moments, fp32 shards on the optimizer's device.
        flat: 1-D, ``param.capacity`` elements: the parameters' storage.
        grad_flat: 1-D, stage 1 only: the whole gradient buffer behind every ``.grad``.
        params: name -> parameter, in layout order.
    """

    param: Chunk
    grad: Chunk
    master: Chunk | None
    exp_avg: Chunk
    exp_avg_sq: Chunk
    flat: torch.Tensor
    grad_flat: torch.Tensor | None
    params: dict[str, nn.Parameter] = field(default_factory=dict)
    num_ready: int = 0  # gradients of this backward copied in (stage 2)
    open: bool = False  # a gradient buffer is gathered for this backward (stage 2)

    @property
    def fp32(self) -> Chunk:
        """The chunk Adam updates: the master, or the fp32 parameter shard itself."""
        return self.master if self.master is not None else self.param


def _round_up(n: int, k: int) -> int:
    return -(-n // k) * k


def _pack(named: Sequence[tuple[str, nn.Parameter]], bucket_numel: int) -> list[list[int]]:
    groups: list[list[int]] = []
    used = bucket_numel
    for i, (_, p) in enumerate(named):
        if used + p.numel() > bucket_numel and used > 0:
            groups.append([])
            used = 0
        groups[-1].append(i)
        used += p.numel()
    return groups


def _zeros_like_layout(
    like: Chunk, chunk_id: int, kind: str, device: torch.device, dtype: torch.dtype
) -> Chunk:
    twin = like.same_layout(chunk_id, dtype, kind)
    storage = torch.zeros(twin.shard_numel, dtype=dtype, device=device)
    twin.fill_shard(storage, _Zeros(twin))
    return twin


class _Zeros(dict):
    """A mapping that reads as zeros of every record's shape (``Chunk.fill_shard`` input)."""

    def __init__(self, chunk: Chunk):
        super().__init__({n: torch.zeros(r.numel) for n, r in chunk.records.items()})


@torch.no_grad()
def build_buckets(
    named: Sequence[tuple[str, nn.Parameter]],
    *,
    dtype: torch.dtype,
    master: bool,
    state_device: torch.device,
    stage: int,
    bucket_numel: int,
    group: dist.ProcessGroup | None,
    state_dtype: torch.dtype = torch.float32,
) -> list[Bucket]:
    """Buckets for ``named`` (trainable parameters, fp32 values, the same on every rank); masters
    and moments in ``state_dtype``.

    Afterwards every parameter is a ``dtype`` view into its bucket's ``flat`` (all-gathered from
    the shards, so every rank holds the shard owners' values) and, for stage 1, ``.grad`` a view
    into ``grad_flat``.
    """
    world = dist.get_world_size(group) if group is not None else 1
    ordered = list(reversed(named))
    buckets = []
    for bi, idx in enumerate(_pack(ordered, bucket_numel)):
        members = [ordered[i] for i in idx]
        cap = _round_up(max(sum(p.numel() for _, p in members), 1), world)
        device = members[0][1].device
        pchunk = Chunk(5 * bi, cap, dtype, kind="param", group=group)
        for name, p in members:
            pchunk.add(name, p.shape)
        values = {name: p.detach() for name, p in members}
        mchunk = None
        if master:
            mchunk = pchunk.same_layout(5 * bi + 1, state_dtype, "master")
            shard = torch.empty(cap // world, dtype=state_dtype, device=state_device)
            mchunk.fill_shard(shard, values)
        flat = torch.zeros(cap, dtype=dtype, device=device)
        rank = pchunk.rank
        lo = rank * pchunk.shard_numel
        pchunk.fill_shard(flat[lo : lo + pchunk.shard_numel] if world > 1 else flat, values)
        pchunk.gather(flat)  # in place: the shard is a slice of flat
        gchunk = pchunk.same_layout(5 * bi + 2, dtype, "grad")
        grad_flat = None
        if stage == 1:
            grad_flat = torch.zeros(cap, dtype=dtype, device=device)
            gshard = grad_flat[lo : lo + pchunk.shard_numel] if world > 1 else grad_flat
            gchunk.fill_shard(gshard, _Zeros(gchunk))
            gchunk.materialize(grad_flat)
        else:
            gchunk.fill_shard(torch.zeros(cap // world, dtype=dtype, device=device), _Zeros(gchunk))
        bucket = Bucket(
            param=pchunk,
            grad=gchunk,
            master=mchunk,
            exp_avg=_zeros_like_layout(pchunk, 5 * bi + 3, "exp_avg", state_device, state_dtype),
            exp_avg_sq=_zeros_like_layout(
                pchunk, 5 * bi + 4, "exp_avg_sq", state_device, state_dtype
            ),
            flat=flat,
            grad_flat=grad_flat,
        )
        for name, p in members:
            p.data = pchunk.view(name)
            if grad_flat is not None:
                p.grad = gchunk.view(name)
            bucket.params[name] = p
        buckets.append(bucket)
    return buckets
