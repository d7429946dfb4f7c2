"""Rank-side checks of the Evoformer under dynamic axial parallelism (run inside a World), and
the single-process reference they are compared with."""

from __future__ import annotations

import torch

from colossal_models import Evoformer, EvoformerConfig, parallelize_evoformer
from colossal_parallel import MeshConfig, ProcessMesh

CFG = EvoformerConfig.preset("tiny")
B, S, R = 1, 4, 8  # divisible by 2 and 4


def model() -> Evoformer:
    torch.manual_seed(0)
    return Evoformer(CFG)


def inputs(n_seq: int = S, n_res: int = R) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(1)
    m = torch.randn(B, n_seq, n_res, CFG.c_m, generator=g)
    z = torch.randn(B, n_res, n_res, CFG.c_z, generator=g)
    wm, wz = torch.randn(m.shape, generator=g), torch.randn(z.shape, generator=g)
    ws = torch.randn(B, n_res, CFG.c_s, generator=g)
    return m, z, wm, wz, ws


def run(net: Evoformer, chunk_size: int | None = None) -> dict:
    """Forward and backward of a fixed weighted sum of the outputs; outputs and gradients."""
    m, z, wm, wz, ws = inputs()
    m.requires_grad_(True)
    z.requires_grad_(True)
    om, oz, os_ = net(m, z, chunk_size=chunk_size)
    out = {"m": om.detach(), "z": oz.detach(), "s": os_.detach()}
    out["fwd_bytes"] = _bytes(net)
    ((om * wm).sum() + (oz * wz).sum() + (os_ * ws).sum()).backward()
    out["grad_m"], out["grad_z"] = m.grad, z.grad
    out["params"] = {k: p.grad.clone() for k, p in net.named_parameters()}
    out["all_bytes"] = _bytes(net)
    return out


def _bytes(net: Evoformer) -> dict[str, int]:
    counter = getattr(net.axes, "comm", None)
    if counter is None:
        return {}
    c = counter.counter
    return {op: c.bytes(op=op) for op in {o for (_, o) in c.snapshot()}}


def dap_rank(p: int, chunk_size: int | None) -> dict:
    mesh = ProcessMesh(MeshConfig(tp=p))
    net = parallelize_evoformer(model(), mesh)
    out = run(net, chunk_size)
    mesh.close()
    return out


def dap_bad_shapes(p: int) -> list[str]:
    """Indivisible MSA depth, then residue count: one-line ConfigErrors, nothing sent."""
    mesh = ProcessMesh(MeshConfig(tp=p))
    net = parallelize_evoformer(model(), mesh)
    msgs = []
    for n_seq, n_res in ((p + 1, R), (S, 2 * p + 2)):
        m, z, *_ = inputs(n_seq, n_res)
        try:
            net(m, z)
        except Exception as e:
            msgs.append(f"{type(e).__name__}: {e}")
    try:
        parallelize_evoformer(net, mesh)
    except Exception as e:
        msgs.append(f"{type(e).__name__}: {e}")
    msgs.append(f"calls={mesh.comm.counter.calls()}")
    mesh.close()
    return msgs


def dap_with_dp_rank() -> dict:
    """dp=2 x DAP=2 on 4 ranks: each replica takes one batch element; gradients summed over dp."""
    mesh = ProcessMesh(MeshConfig(dp=2, tp=2))
    net = parallelize_evoformer(model(), mesh)
    m, z, wm, wz, ws = inputs_batch2()
    i = mesh.coord("dp")
    sl = slice(i, i + 1)
    om, oz, os_ = net(m[sl], z[sl])
    ((om * wm[sl]).sum() + (oz * wz[sl]).sum() + (os_ * ws[sl]).sum()).backward()
    grads = {}
    for k, p in net.named_parameters():
        grads[k] = mesh.comm.all_reduce(p.grad, "dp")
    mesh.close()
    return grads


def inputs_batch2() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(2)
    m = torch.randn(2, S, R, CFG.c_m, generator=g)
    z = torch.randn(2, R, R, CFG.c_z, generator=g)
    wm, wz = torch.randn(m.shape, generator=g), torch.randn(z.shape, generator=g)
    return m, z, wm, wz, torch.randn(2, R, CFG.c_s, generator=g)


def reference_batch2() -> dict:
    net = model()
    m, z, wm, wz, ws = inputs_batch2()
    om, oz, os_ = net(m, z)
    ((om * wm).sum() + (oz * wz).sum() + (os_ * ws).sum()).backward()
    return {k: p.grad for k, p in net.named_parameters()}
