"""Counted point-to-point messages along one mesh axis, posted together by ``batch_isend_irecv``.

Peers are addressed by their coordinate along the axis; every message carries a tag so that
messages between the same two ranks never match the wrong receive (a pipeline sends activations
and gradients over the same link when stages wrap around). Bytes are counted per
[Note: counted bytes]: ``send`` on the sender, ``recv`` on the receiver.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from colossal_contracts import ConfigError

if TYPE_CHECKING:
    from ._comm import CountedComm

__all__ = ["P2PMessage", "exchange", "wait_all"]

# (tensor, peer coordinate along the axis, tag): the tensor is sent from, or received into.
P2PMessage = tuple[torch.Tensor, int, int]


def exchange(
    comm: CountedComm,
    axis: str,
    *,
    sends: Sequence[P2PMessage] = (),
    recvs: Sequence[P2PMessage] = (),
) -> list[dist.Work]:
    """Post every send and receive in one ``batch_isend_irecv``; the works to wait on.

    Send tensors must stay untouched, and receive tensors unread, until their works complete.
    """
    mesh = comm.mesh
    group = mesh.group(axis)
    ops = []
    for kind, op, msgs in (("send", dist.isend, sends), ("recv", dist.irecv, recvs)):
        for t, peer, tag in msgs:
            if not 0 <= peer < mesh.size(axis) or peer == mesh.coord(axis):
                raise ConfigError(
                    f"point-to-point {kind} along {axis!r} needs a peer coordinate other than "
                    f"this rank's in [0, {mesh.size(axis)}), got {peer}"
                )
            if not t.is_contiguous():
                raise ConfigError(f"point-to-point {kind} needs a contiguous tensor")
            comm.counter.record(axis, kind, t.numel() * t.element_size())
            ops.append(dist.P2POp(op, t, mesh.global_rank(axis, peer), group, tag))
    if not ops:
        return []
    return list(dist.batch_isend_irecv(ops))


def wait_all(works: Sequence[dist.Work]) -> None:
    """Block until every work of ``works`` has completed."""
    for w in works:
        w.wait()
