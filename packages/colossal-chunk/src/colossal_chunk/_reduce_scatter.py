"""How a chunk's gathered buffer is reduce-scattered: the backend's collective, or, on gloo, one
all-to-all and a local sum.

[Note: reduce-scatter on gloo] gloo's ``reduce_scatter_tensor`` (torch 2.13, loopback) takes
two to three times as long as an all-to-all of the same buffer followed by a local sum of what
arrives. Median milliseconds, fp32 buffers, on a 2-core host (``python benchmarks/run.py
collectives``, methods alternated):

    buffer    2 ranks: gloo / all-to-all + sum    4 ranks: gloo / all-to-all + sum
    1 MiB              2.3  / 0.7                          7.2  / 2.3
    3 MiB              4.1  / 1.9                          7.6  / 4.2
    16 MiB            15.8  / 7.6                         31.3  / 16.8

(gloo's all-gather is not slow that way on 2 ranks, nor at 16 MiB: an all-to-all in its place
was no faster there, though 1.7-1.9x faster for 1-3 MiB on 4 ranks; gathers stay gloo's and
go coalesced: [Note: coalesced gathers] in ``_collectives.py``.) Under a
tight budget chunks are small and a step reduce-scatters one per chunk, so on a gloo group with
host tensors a chunk is reduce-scattered as an all-to-all: rank ``j`` is sent the ``j``-th
slice of the buffer, so every rank receives the ``ws`` contributions to its own slice, each in
one hop, and ``wait()`` sums them over ranks (torch's sum over the rank dimension: in rank
order, bf16 accumulated in fp32). The result is the reduce-scatter's: equal bit for bit to
gloo's in fp32 on 2 and 4 ranks where measured; integer-valued sums are exact either way
(tests). Its cost is a receive buffer the size of the gathered buffer while the collective is
in flight: workspace of the collective, like the scratch a backend allocates inside its own,
made and used with torch's dispatch modes off, so a tracer of live tensors (memtrace's) does
not count it as non-model data, nor a chunk manager's budget as model data. On an emulated
accelerator it stands in for a collective that on the device needs no such buffer; on a CPU
that is the device it is transient host memory, at most one gathered buffer per reduce-scatter
in flight; a chunk manager without a budget keeps its memory for the next one, as it keeps
gathered buffers' ([Note: gathered buffer cache] in ``_gathered_cache.py``). Every other
backend or device (NCCL on GPUs) runs its own reduce-scatter.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import _disable_current_modes

from ._pending import _Work

if TYPE_CHECKING:
    from ._gathered_cache import GatheredCache

__all__ = ["SummedAllToAll", "all_to_all_is_faster", "launch_reduce_scatter"]

# torch 2.13 renamed reduce_scatter_tensor (deprecated, warning on every call) to
# reduce_scatter_single.
_native = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def all_to_all_is_faster(full: torch.Tensor, group: dist.ProcessGroup | None) -> bool:
    """Whether reducing ``full`` over ``group`` runs as an all-to-all and a local sum (gloo,
    host tensors: [Note: reduce-scatter on gloo])."""
    return full.device.type == "cpu" and "gloo" in str(dist.get_backend(group))


def launch_reduce_scatter(
    out: torch.Tensor,
    full: torch.Tensor,
    group: dist.ProcessGroup | None,
    *,
    all_to_all: bool | None = None,
    workspace: GatheredCache | None = None,
) -> _Work:
    """Start reducing (summing) ``full`` over ``group``'s ranks into this rank's slice ``out``
    (``full``'s ``1 / ws``, contiguous); the result is in ``out`` once the returned handle's
    ``wait()`` ran. ``full`` must stay alive and unchanged until then. ``all_to_all``: as an
    all-to-all and a local sum (a receive buffer of ``full``'s size until ``wait()``), or the
    backend's own collective; None: whichever ``all_to_all_is_faster`` says. Collective: every
    rank must choose the same. ``workspace``: where the receive buffer is taken from and given
    back to (None: a new one each time)."""
    if all_to_all is None:
        all_to_all = all_to_all_is_faster(full, group)
    if all_to_all:
        return SummedAllToAll(out, full, group, workspace=workspace)
    return _native(out, full, group=group, async_op=True)


class SummedAllToAll:
    """A reduce-scatter as an all-to-all in flight; ``wait()`` sums the received slices into
    ``out`` ([Note: reduce-scatter on gloo]) and drops the receive buffer (gives it back to
    ``workspace``, when one was given). ``wait()`` may be called more than once."""

    def __init__(
        self,
        out: torch.Tensor,
        full: torch.Tensor,
        group: dist.ProcessGroup | None,
        *,
        workspace: GatheredCache | None = None,
    ) -> None:
        if full.numel() != out.numel() * dist.get_world_size(group):
            raise ValueError(
                f"reduce-scatter of {full.numel()} elements into {out.numel()} per rank over "
                f"{dist.get_world_size(group)} ranks: the buffer must be world size x the slice"
            )
        self._out, self._workspace = out, workspace
        with _disable_current_modes():  # workspace: no tracer sees it
            kept = None if workspace is None else workspace.allocate(full.numel(), full.dtype)
            self._received: torch.Tensor | None = torch.empty_like(full) if kept is None else kept
            self._work: _Work | None = dist.all_to_all_single(
                self._received, full, group=group, async_op=True
            )

    def wait(self) -> bool:
        work, self._work = self._work, None
        received, self._received = self._received, None
        if work is not None and received is not None:
            with _disable_current_modes():
                work.wait()
                torch.sum(received.view(-1, self._out.numel()), dim=0, out=self._out.view(-1))
            if self._workspace is not None:  # its mapping is free once gloo lets go of it
                self._workspace.give(received)
        return True
