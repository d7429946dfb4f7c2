"""FastFold's two levers on the Evoformer: dynamic axial parallelism (DAP) and chunked inference.

1. DAP on 1, 2 and 4 gloo ranks of this machine: time per block (forward + backward) and peak
   live-tensor bytes per rank (LiveTensorTracker on the CPU), and the counted communication
   against ``dap_comm_bytes``. One block of the ``small`` preset.
2. Chunked inference, AlphaFold 2 sizes (one block, c_m=256, c_z=128, S MSA sequences), traced on
   the meta device with the live-tensor tracer (exact bytes of the operators' live storages, no
   allocation): peak bytes against residue count with and without chunking, and the largest
   residue count whose peak fits a fixed budget. One point is re-measured on real CPU tensors to
   show meta and CPU agree.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from colossal_contracts import TierName
from colossal_memtrace import LiveTensorTracker
from colossal_models.evoformer import (
    Evoformer,
    EvoformerConfig,
    chunk_size_for_budget,
    dap_comm_bytes,
    parallelize_evoformer,
)
from colossal_parallel import MeshConfig, ProcessMesh
from colossal_testing import World

from _report import Report

MIB = 2**20
DAP_CFG = EvoformerConfig.preset("small", num_blocks=1, c_s=0)
AF2 = EvoformerConfig.preset("alphafold2", num_blocks=1, c_s=0)


def _dap_inputs(S: int, R: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    m = torch.randn(1, S, R, DAP_CFG.c_m, generator=g)
    return m, torch.randn(1, R, R, DAP_CFG.c_z, generator=g)


def dap_rank(p: int, S: int, R: int, timed: bool) -> dict:
    """Rank-side, one small block fwd + bwd after a warm-up step: with ``timed`` the ms of one
    step, else the peak live bytes beyond the parameters and the counted bytes of one step."""
    mesh = ProcessMesh(MeshConfig(tp=p)) if p > 1 else None
    torch.manual_seed(0)
    net = Evoformer(DAP_CFG)
    if mesh is not None:
        parallelize_evoformer(net, mesh)
    m, z = _dap_inputs(S, R)

    def step() -> None:
        om, oz, _ = net(m, z)
        (om.square().mean() + oz.square().mean()).backward()

    step()  # warm up
    if mesh is not None:
        mesh.comm.counter.reset()
        torch.distributed.barrier()
    out: dict = {}
    if timed:
        t = time.perf_counter()
        step()
        out["ms"] = 1e3 * (time.perf_counter() - t)
    else:
        with LiveTensorTracker("cpu") as tr:
            tr.track(net.parameters(), model=True)
            base = tr.used_bytes(TierName.ACCELERATOR)
            step()
            out["peak"] = tr.peak_bytes(TierName.ACCELERATOR) - base
        out["counted"] = mesh.comm.counter.bytes() if mesh is not None else 0
    if mesh is not None:
        mesh.close()
    return out


def _dap_training(S: int, R: int, rounds: int) -> dict[int, dict]:
    """Peak, counted bytes and the median ms over ``rounds`` on 1, 2 and 4 ranks, the three
    worlds alive together and run in turn, round by round (order rotated), so that the load of
    the machine falls on all three alike."""
    sizes = (1, 2, 4)
    worlds = {p: World(p) for p in sizes}
    try:
        out = {p: worlds[p].run(dap_rank, p, S, R, False) for p in sizes}
        res = {
            p: {"peak": max(r["peak"] for r in out[p]), "counted": out[p][0]["counted"]}
            for p in sizes
        }
        times: dict[int, list[float]] = {p: [] for p in sizes}
        for i in range(rounds):
            for p in sizes[i % 3 :] + sizes[: i % 3]:
                times[p].append(max(r["ms"] for r in worlds[p].run(dap_rank, p, S, R, True)))
        for p in sizes:
            res[p]["ms"] = sorted(times[p])[rounds // 2]
    finally:
        for w in worlds.values():
            w.close()
    return res


def dap_infer_rank(p: int, S: int, R: int, chunk: int | None) -> dict:
    """Rank-side: one no-grad AlphaFold 2 block under DAP over p ranks; peak live bytes beyond
    the parameters (the whole inputs and outputs every rank holds included)."""
    mesh = ProcessMesh(MeshConfig(tp=p)) if p > 1 else None
    torch.manual_seed(0)
    net = Evoformer(AF2)
    if mesh is not None:
        parallelize_evoformer(net, mesh)
    g = torch.Generator().manual_seed(0)
    m, z = torch.randn(1, S, R, AF2.c_m, generator=g), torch.randn(1, R, R, AF2.c_z, generator=g)
    with torch.no_grad(), LiveTensorTracker("cpu") as tr:
        tr.track(net.parameters(), model=True)
        tr.track((m, z))
        net(m, z, chunk_size=chunk)
        peak = tr.peak_bytes(TierName.ACCELERATOR) - tr.used_bytes(TierName.ACCELERATOR, model=True)
    if mesh is not None:
        mesh.close()
    return {"peak": peak}


def _peak_meta(cfg: EvoformerConfig, S: int, R: int, chunk: int | None, device: str) -> int:
    """Peak live bytes of one no-grad forward beyond the parameters (inputs included)."""
    with torch.device(device):
        net = Evoformer(cfg)
        torch.manual_seed(0)
        m, z = torch.randn(1, S, R, cfg.c_m), torch.randn(1, R, R, cfg.c_z)
    with torch.no_grad(), LiveTensorTracker(device) as tr:
        tr.track(net.parameters(), model=True)
        tr.track((m, z))
        net(m, z, chunk_size=chunk)
        return tr.peak_bytes(TierName.ACCELERATOR) - tr.used_bytes(TierName.ACCELERATOR, model=True)


def _chunk_for(budget: int, S: int, R: int) -> int | None:
    """A quarter of the budget for the chunked temporaries (the rest: m, z, the triangular
    multiplicative updates); at least one row."""
    try:
        return chunk_size_for_budget(AF2, budget // 4, batch=1, num_seq=S, num_res=R)
    except Exception:
        return 1


def _largest_fit(budget: int, S: int, chunked: bool, step: int, hi: int) -> int:
    """Largest multiple of ``step`` up to ``hi`` whose traced peak fits ``budget`` (bisection)."""
    lo_ok, hi_bad = 0, hi + step
    while hi_bad - lo_ok > step:
        mid = (lo_ok + hi_bad) // 2 // step * step
        chunk = _chunk_for(budget, S, mid) if chunked else None
        if _peak_meta(AF2, S, mid, chunk, "meta") <= budget:
            lo_ok = mid
        else:
            hi_bad = mid
    return lo_ok


def _plot(rows: list[dict], out_dir: Path) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for label in ("unchunked", "chunk 4", "chunk 64"):
        pts = [(r["R"], r["peak MiB"]) for r in rows if r["chunk"] == label]
        ax.plot(*zip(*pts), marker="o", label=label)
    ax.set_xlabel("residues R")
    ax.set_ylabel("peak activation MiB (one block, no grad)")
    ax.set_yscale("log")
    ax.set_title("AlphaFold 2 Evoformer block, S=128: chunked inference")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    name = "evoformer.png"
    fig.savefig(out_dir / name, dpi=110)
    plt.close(fig)
    return name


def run(quick: bool, out_dir: Path) -> Report:
    rows: list[dict] = []
    S_dap, R_dap, rounds = (8, 32, 3) if quick else (16, 64, 7)
    dap = _dap_training(S_dap, R_dap, rounds)
    for p in (1, 2, 4):
        formula = dap_comm_bytes(
            DAP_CFG, batch=1, num_seq=S_dap, num_res=R_dap, p=p, backward=True, input_grads=False
        )
        dap[p]["formula"] = sum(formula.values())
        rows.append(
            {
                "measurement": "DAP fwd+bwd, small preset",
                "ranks": p,
                "S": S_dap,
                "R": R_dap,
                "ms/block": dap[p]["ms"],
                "peak MiB/rank": dap[p]["peak"] / MIB,
                "vs 1 rank": dap[p]["peak"] / dap[1]["peak"] if p > 1 else 1.0,
                "counted MiB": dap[p]["counted"] / MIB,
                "formula MiB": dap[p]["formula"] / MIB,
            }
        )
    S_inf, R_inf, c_inf = (32, 64, 16) if quick else (64, 128, 32)
    for p in (1, 2, 4):
        for label, chunk in (("unchunked", None), (f"chunk {c_inf}", c_inf)):
            if p == 1:
                res = [dap_infer_rank(1, S_inf, R_inf, chunk)]
            else:
                with World(p) as world:
                    res = world.run(dap_infer_rank, p, S_inf, R_inf, chunk)
            rows.append(
                {
                    "measurement": "DAP inference, AF2 block (CPU)",
                    "ranks": p,
                    "S": S_inf,
                    "R": R_inf,
                    "chunk": label,
                    "peak MiB/rank": max(r["peak"] for r in res) / MIB,
                }
            )
    S = 128
    res_counts = [64, 128, 256] if quick else [64, 128, 192, 256, 384, 512]
    peaks: dict[tuple[int, str], int] = {}
    for R in res_counts:
        for label, chunk in (("unchunked", None), ("chunk 64", 64), ("chunk 4", 4)):
            peaks[(R, label)] = pk = _peak_meta(AF2, S, R, chunk, "meta")
            rows.append(
                {
                    "measurement": "inference peak (meta), AF2 block",
                    "S": S,
                    "R": R,
                    "chunk": label,
                    "peak MiB": pk / MIB,
                    "vs unchunked": pk / peaks[(R, "unchunked")],
                }
            )
    R_check = 64
    cpu = _peak_meta(AF2, S, R_check, 4, "cpu")
    budget = 2 * 2**30 if not quick else 512 * MIB
    hi, step = (2048, 64) if not quick else (1024, 64)
    fit_plain = _largest_fit(budget, S, False, step, hi)
    fit_chunked = _largest_fit(budget, S, True, step, hi)
    for label, fit in (("unchunked", fit_plain), ("chunked", fit_chunked)):
        rows.append(
            {
                "measurement": f"largest R under {budget / MIB:.0f} MiB (meta)",
                "S": S,
                "R": fit,
                "chunk": label
                if label == "unchunked"
                else f"chunk_size_for_budget(budget/4) = {_chunk_for(budget, S, fit)}",
                "peak MiB": _peak_meta(
                    AF2, S, fit, _chunk_for(budget, S, fit) if label == "chunked" else None, "meta"
                )
                / MIB,
            }
        )
    figure = _plot([r for r in rows if r.get("measurement", "").startswith("inference")], out_dir)
    big = res_counts[-1]
    summary = {
        "DAP counted bytes equal dap_comm_bytes on 2 and 4 ranks": all(
            dap[p]["counted"] == dap[p]["formula"] for p in (2, 4)
        ),
        "DAP peak MiB/rank, 2 ranks / 1 rank": dap[2]["peak"] / dap[1]["peak"],
        "DAP peak MiB/rank, 4 ranks / 1 rank": dap[4]["peak"] / dap[1]["peak"],
        "DAP ms/block 2 ranks / 1 rank (2 loaded cores)": dap[2]["ms"] / dap[1]["ms"],
        "DAP ms/block 4 ranks / 1 rank (2 loaded cores)": dap[4]["ms"] / dap[1]["ms"],
        f"peak chunk 4 / unchunked at R={big}": peaks[(big, "chunk 4")] / peaks[(big, "unchunked")],
        f"meta peak == CPU peak (R={R_check}, chunk 4)": cpu == peaks[(R_check, "chunk 4")],
        f"largest R under {budget / MIB:.0f} MiB, unchunked": fit_plain,
        f"largest R under {budget / MIB:.0f} MiB, chunked": fit_chunked,
    }
    return Report(
        name="evoformer",
        title="Evoformer: dynamic axial parallelism and chunked inference",
        columns=[
            "measurement",
            "ranks",
            "S",
            "R",
            "chunk",
            "ms/block",
            "peak MiB/rank",
            "vs 1 rank",
            "counted MiB",
            "formula MiB",
            "peak MiB",
            "vs unchunked",
        ],
        rows=rows,
        summary=summary,
        notes=[
            "DAP rows: one block of the small preset (c_m=64, c_z=32), batch 1, forward and "
            "backward of a squared-mean loss, gloo over loopback; ms/block is the median over "
            "rounds of one step of the slowest rank, the 1-, 2- and 4-rank worlds run in turn "
            "round by round; peak MiB/rank is the live-tensor tracer's peak beyond the "
            "parameters (inputs, activations, gradients, communication buffers).",
            "The machine has 2 CPU cores shared with other work: 2 and 4 ranks oversubscribe "
            "it, so DAP times show overhead, not the speed-up FastFold reports on GPUs. Memory "
            "and bytes do not depend on load.",
            "DAP inference rows: one AlphaFold 2 block, no grad, real CPU tensors (not timed: "
            "the loaded 2-core machine takes tens of seconds per block); the peak per rank "
            "includes the whole m and z every rank takes in and gets back.",
            "Inference rows: one AlphaFold 2 block (c_m=256, c_z=128, 8/4 heads) under "
            "torch.no_grad, traced on the meta device: exact bytes of live storages between "
            "operators (kernel scratch is not seen). Peaks include m and z. Attention, "
            "transitions, the outer product mean and the triangular multiplicative updates are "
            "chunked; what stays is m, z, LayerNorm(z) and the updates' whole other operand.",
            "Largest R: bisection over multiples of 64 of the traced peak against the budget; "
            "the chunked run takes its chunk size from chunk_size_for_budget with a quarter of "
            "the budget.",
        ],
        figures=[figure],
    )
