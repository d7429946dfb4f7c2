"""Ring attention: causal attention over a sequence split across the ``sp`` ranks.

[Note: ring attention] Each rank keeps its queries and passes its key/value block around the
``sp`` ring: at step ``i`` rank ``r`` holds the block of rank ``r - i`` and folds it into its
output with the online softmax (running row max ``m``, row sum ``l``, unnormalised output), while
the next block is already in flight (``batch_isend_irecv``). Blocks are cut into the layout's
chunks ([Note: sequence layouts]), and those into tiles of at most ``tile`` tokens; a tile pair
whose keys all come after its queries is skipped, one whose keys all come before is computed
without a mask, and only a tile facing itself is masked. Backward recomputes the softmax from the saved log-sum-exp, passing the key/value blocks
round again together with their gradient accumulators, which arrive back at their owner after
``sp`` hops. Per rank, forward sends ``(sp-1)`` key/value blocks, backward ``(sp-1)`` key/value
blocks and ``sp`` gradient blocks (``ring_attention_comm_bytes``); memory is that of one rank's
queries, keys and values plus two blocks in flight, never the whole sequence.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from colossal_contracts import ConfigError

from .._comm import CountedComm
from .._p2p import exchange, wait_all
from ._layout import SEQ_LAYOUTS, check_sequence

__all__ = ["ring_attention", "ring_attention_comm_bytes"]

_NEG = -1e30  # finite "minus infinity": masked scores, and the max of a row that saw nothing yet


def _segments(
    local_len: int, size: int, coord: int, layout: str, tile: int
) -> list[tuple[int, int, int]]:
    """``(local offset, global start, length)`` of the tiles (at most ``tile`` tokens, never
    across a chunk boundary) of the chunks rank ``coord`` holds."""
    if layout == "contiguous":
        chunks = [(0, coord * local_len, local_len)]
    else:
        c = local_len // 2
        chunks = [(0, coord * c, c), (c, (2 * size - 1 - coord) * c, c)]
    return [
        (off + i, start + i, min(tile, length - i))
        for off, start, length in chunks
        for i in range(0, length, tile)
    ]


def _pairs(qsegs, ksegs, device: torch.device):
    """``(q slice, k slice, mask or None)`` of every chunk pair with work in it."""
    out = []
    for qo, qs, ql in qsegs:
        for ko, ks, kl in ksegs:
            if ks > qs + ql - 1:
                continue  # every key after every query: fully masked, skipped
            mask = None
            if ks + kl - 1 > qs:  # overlapping ranges: the causal diagonal
                qpos = torch.arange(qs, qs + ql, device=device)
                kpos = torch.arange(ks, ks + kl, device=device)
                mask = qpos[:, None] >= kpos[None, :]  # (ql, kl), True = attend
            out.append((slice(qo, qo + ql), slice(ko, ko + kl), mask))
    return out


def _ring_step(comm: CountedComm, axis: str, send: torch.Tensor, tag: int):
    """Post the send of ``send`` to the next rank and the receive from the previous one."""
    p, me = comm.size(axis), comm.coord(axis)
    buf = torch.empty_like(send)
    works = exchange(
        comm, axis, sends=[(send, (me + 1) % p, tag)], recvs=[(buf, (me - 1) % p, tag)]
    )
    return buf, works


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, q, k, v, comm: CountedComm, axis: str, layout: str, tile: int):
        p, me = comm.size(axis), comm.coord(axis)
        B, H, L, D = q.shape
        scale = 1.0 / math.sqrt(D)
        wd = torch.promote_types(q.dtype, torch.float32)  # fp32 at least, fp64 stays fp64
        qf = q.detach().to(wd)
        qsegs = _segments(L, p, me, layout, tile)
        m = torch.full((B, H, L), _NEG, dtype=wd, device=q.device)
        lsum = torch.zeros(B, H, L, dtype=wd, device=q.device)
        acc = torch.zeros(B, H, L, D, dtype=wd, device=q.device)
        kv = torch.stack([k.detach(), v.detach()]).to(wd).contiguous()  # (2, B, H, L, D)
        for step in range(p):
            src = (me - step) % p
            nxt, works = _ring_step(comm, axis, kv, step) if step < p - 1 else (None, [])
            for qsl, ksl, mask in _pairs(qsegs, _segments(L, p, src, layout, tile), q.device):
                s = qf[:, :, qsl] @ kv[0][:, :, ksl].transpose(-1, -2) * scale  # (B, H, lq, lk)
                if mask is not None:
                    s = s.masked_fill(~mask, _NEG)
                m_old = m[:, :, qsl]
                m_new = torch.maximum(m_old, s.amax(-1))
                pr = torch.exp(s - m_new[..., None])
                if mask is not None:
                    pr = pr.masked_fill(~mask, 0.0)
                corr = torch.exp(m_old - m_new)
                lsum[:, :, qsl] = lsum[:, :, qsl] * corr + pr.sum(-1)
                acc[:, :, qsl] = acc[:, :, qsl] * corr[..., None] + pr @ kv[1][:, :, ksl]
                m[:, :, qsl] = m_new
            wait_all(works)
            if nxt is not None:
                kv = nxt
        out = acc / lsum[..., None]
        lse = m + torch.log(lsum)  # (B, H, L)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.comm, ctx.axis, ctx.layout, ctx.tile = comm, axis, layout, tile
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor):
        q, k, v, out, lse = ctx.saved_tensors
        comm, axis, layout, tile = ctx.comm, ctx.axis, ctx.layout, ctx.tile
        p, me = comm.size(axis), comm.coord(axis)
        B, H, L, D = q.shape
        scale = 1.0 / math.sqrt(D)
        wd = torch.promote_types(q.dtype, torch.float32)
        qf, do = q.to(wd), dout.to(wd)
        delta = (do * out).sum(-1)  # (B, H, L)
        qsegs = _segments(L, p, me, layout, tile)
        dq = torch.zeros(B, H, L, D, dtype=wd, device=q.device)
        kv = torch.stack([k, v]).to(wd).contiguous()
        dkv = torch.zeros_like(kv)  # gradient of the block held now; travels with it
        for step in range(p):
            src = (me - step) % p
            nxt, works = _ring_step(comm, axis, kv, 2 * p + step) if step < p - 1 else (None, [])
            for qsl, ksl, mask in _pairs(qsegs, _segments(L, p, src, layout, tile), q.device):
                kb, vb = kv[0][:, :, ksl], kv[1][:, :, ksl]
                s = qf[:, :, qsl] @ kb.transpose(-1, -2) * scale
                pr = torch.exp(s - lse[:, :, qsl, None])
                if mask is not None:
                    pr = pr.masked_fill(~mask, 0.0)
                dob = do[:, :, qsl]
                dkv[1][:, :, ksl] += pr.transpose(-1, -2) @ dob
                ds = pr * (dob @ vb.transpose(-1, -2) - delta[:, :, qsl, None]) * scale
                dq[:, :, qsl] += ds @ kb
                dkv[0][:, :, ksl] += ds.transpose(-1, -2) @ qf[:, :, qsl]
            wait_all(works)
            # the accumulator follows its block to the next rank; the last hop brings ours home
            dkv, dworks = _ring_step(comm, axis, dkv, 4 * p + step) if p > 1 else (dkv, [])
            wait_all(dworks)
            if nxt is not None:
                kv = nxt
        dk, dv = dkv[0].to(k.dtype), dkv[1].to(v.dtype)
        return dq.to(q.dtype), dk, dv, None, None, None, None


def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    comm: CountedComm,
    *,
    axis: str = "sp",
    layout: str = "zigzag",
    tile: int = 256,
) -> torch.Tensor:
    """Causal attention of this rank's queries over the whole sequence ([Note: ring attention]).

    ``q, k, v`` are ``(B, H, L, D)``: the ``L = T / sp`` tokens this rank holds in ``layout``
    ([Note: sequence layouts]). Returns this rank's ``(B, H, L, D)`` output, equal to the
    matching rows of full causal attention. Scores are formed ``tile x tile`` at a time, so
    the temporary memory is ``B * H * tile**2`` whatever the length. No dropout.
    """
    if tile < 1:
        raise ConfigError(f"ring attention tile must be >= 1 token, got {tile}")
    if layout not in SEQ_LAYOUTS:
        raise ConfigError(f"sequence layout must be one of {SEQ_LAYOUTS}, got {layout!r}")
    if q.dim() != 4 or k.shape != q.shape or v.shape != q.shape:
        raise ConfigError(
            f"ring_attention needs q, k, v of one shape (B, H, L, D); got {tuple(q.shape)}, "
            f"{tuple(k.shape)}, {tuple(v.shape)} (repeat shared key/value heads first)"
        )
    check_sequence(q.shape[2] * comm.size(axis), comm.size(axis), layout)
    return _RingAttention.apply(q, k, v, comm, axis, layout, tile)


def ring_attention_comm_bytes(
    batch: int, heads: int, seq_len: int, head_dim: int, sp: int, *, elem_bytes: int = 4
) -> tuple[int, int]:
    """Bytes one rank sends per ring-attention call: ``(forward, backward)``.

    A key/value block is ``2 * B * H * (T/sp) * D`` elements; forward sends ``sp-1`` of them,
    backward ``sp-1`` plus ``sp`` gradient blocks of the same size (always fp32 on the wire).
    """
    if sp == 1:
        return 0, 0
    block = 2 * batch * heads * (seq_len // sp) * head_dim * elem_bytes
    return (sp - 1) * block, (2 * sp - 1) * block
