"""Rank-side checks of ring attention and Ulysses (run inside a colossal_testing World).

Every rank draws the same full ``q, k, v`` and output gradient, computes full causal attention
as the reference, and compares the rows it holds (per its sequence layout) of the output and of
the input gradients with what the distributed attention gives.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from colossal_contracts import ConfigError
from colossal_parallel import MeshConfig, ProcessMesh
from colossal_parallel.sequence import (
    ring_attention,
    ring_attention_comm_bytes,
    sequence_positions,
    ulysses_attention,
    ulysses_comm_bytes,
)

B, H, T, D = 2, 4, 16, 8

METHODS = {
    "ring-zigzag": ("zigzag", lambda q, k, v, c: ring_attention(q, k, v, c, layout="zigzag")),
    "ring-contiguous": (
        "contiguous",
        lambda q, k, v, c: ring_attention(q, k, v, c, layout="contiguous"),
    ),
    "ring-zigzag-tiled": (
        "zigzag",
        lambda q, k, v, c: ring_attention(q, k, v, c, layout="zigzag", tile=3),
    ),
    "ulysses": ("contiguous", lambda q, k, v, c: ulysses_attention(q, k, v, c)),
}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def attention_cases() -> dict:
    """Output and input-gradient errors and counted bytes of each method against the formulas."""
    sp = dist.get_world_size()
    mesh = ProcessMesh(MeshConfig(sp=sp))
    g = torch.Generator().manual_seed(0)
    q, k, v, dout = torch.randn(4, B, H, T, D, generator=g)
    full = [t.clone().requires_grad_(True) for t in (q, k, v)]
    ref = F.scaled_dot_product_attention(*full, is_causal=True)
    ref.backward(dout)
    out = {}
    for name, (layout, fn) in METHODS.items():
        idx = sequence_positions(T, sp, mesh.coord("sp"), layout)
        mine = [t[:, :, idx].clone().requires_grad_(True) for t in (q, k, v)]
        comm = mesh.comm
        comm.counter.reset()
        y = fn(*mine, comm)
        fwd = comm.counter.bytes("sp")
        y.backward(dout[:, :, idx])
        bwd = comm.counter.bytes("sp") - fwd
        if name == "ulysses":
            formula = ulysses_comm_bytes(B, H, T, D, sp)
            counted = (comm.counter.bytes("sp", "all_to_all") - bwd, bwd)
        else:
            formula = ring_attention_comm_bytes(B, H, T, D, sp)
            counted = (fwd // 2, bwd // 2)  # send and recv counted alike: the sends
        out[name] = {
            "out_err": _rel(y.detach(), ref.detach()[:, :, idx]),
            "grad_err": max(_rel(a.grad, b.grad[:, :, idx]) for a, b in zip(mine, full)),
            "bytes": counted,
            "formula": formula,
            "sends": comm.counter.bytes("sp", "send"),
            "recvs": comm.counter.bytes("sp", "recv"),
        }
    mesh.close()
    return out


def attention_errors() -> dict[str, str]:
    """Bad shapes raise ConfigError naming the fix before any collective."""
    sp = dist.get_world_size()
    mesh = ProcessMesh(MeshConfig(sp=sp))
    comm = mesh.comm
    out = {}
    bad_heads = torch.randn(1, sp + 1, 4, 8)
    odd_seq = torch.randn(1, sp, 1, 8)  # 1 token per rank: no zigzag split
    cases = {
        "heads not divisible (ulysses)": lambda: ulysses_attention(
            bad_heads, bad_heads, bad_heads, comm
        ),
        "sequence not divisible (ring)": lambda: ring_attention(odd_seq, odd_seq, odd_seq, comm),
        "unknown layout": lambda: ring_attention(odd_seq, odd_seq, odd_seq, comm, layout="x"),
        "sequence not divisible (positions)": lambda: sequence_positions(10, 4, 0, "zigzag"),
    }
    for name, fn in cases.items():
        try:
            fn()
            out[name] = "no error"
        except ConfigError as e:
            out[name] = f"ok ({comm.counter.calls()} collectives): {e}"
    mesh.close()
    return out
