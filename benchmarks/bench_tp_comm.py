"""Counted communication per device of one tensor-parallel Linear, 1D vs 2D vs 2.5D vs 3D.

Each mode runs a pair of ``hidden -> hidden`` Linears (as in an MLP or attention: 1D is Megatron's
column -> row pair; 2D/2.5D/3D chain two of their Linears) forward and backward on gloo ranks of
this machine, and reads the mesh's ``CommCounter``. Per Linear = pair / 2. The formula column is
the closed form of docs/parallel/{2d,2p5d,3d}.md (1D: one all-reduce of ``tokens x hidden`` per
pass). Wire bytes are what each device sends on a ring (``counted * (g-1)/g`` per collective over
a group of ``g``, twice that for all-reduce). Rows marked ``formula`` extrapolate to 64 devices,
the scale of the 2D/2.5D/3D papers; they are not measured.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

import colossal_parallel as cp
from colossal_testing import World

from _report import Report

E = 4  # fp32 bytes

MODES = {  # mode -> (tp, depth) measured here
    "1d@4": ("1d", 4, 1),
    "2d": ("2d", 4, 1),
    "1d@8": ("1d", 8, 1),
    "2.5d": ("2.5d", 8, 2),
    "3d": ("3d", 8, 1),
}


def measure_pair(mode: str, tp: int, depth: int, hidden: int, batch: int, seq: int) -> dict:
    """Rank-side: counted and wire bytes of a Linear pair, forward and backward."""
    mesh = cp.ProcessMesh(cp.MeshConfig(tp=tp, tp_mode=mode, tp_depth=depth))
    torch.manual_seed(0)
    l1, l2 = nn.Linear(hidden, hidden), nn.Linear(hidden, hidden)
    x = torch.randn(batch, seq, hidden)
    if mode == "1d":
        a = cp.tp1d.ColumnParallelLinear.from_linear(l1, mesh)
        b = cp.tp1d.RowParallelLinear.from_linear(l2, mesh)
        x.requires_grad_()
    else:
        cls = {"2d": cp.grid.Linear2D, "2.5d": cp.grid.Linear2p5D, "3d": cp.grid.Linear3D}[mode]
        lay = {"2d": cp.grid.LAYOUT_2D, "2.5d": cp.grid.LAYOUT_2P5D, "3d": cp.grid.LAYOUT_3D}[mode]
        a = cls.from_linear(l1, mesh, layout=lay)
        b = cls.from_linear(l2, mesh, layout=a.out_layout)
        x = cp.grid.split_to_layout(x, mesh, lay).requires_grad_()
    counter = mesh.comm.counter

    def wire(snap: dict) -> float:
        total = 0.0
        for (axis, op), stat in snap.items():
            g = mesh.size(axis)
            total += stat.bytes * (g - 1) / g * (2 if op == "all_reduce" else 1)
        return total

    counter.reset()
    y = b(a(x))
    fwd, fwd_wire = counter.bytes(), wire(counter.snapshot())
    counter.reset()
    y.sum().backward()
    bwd, bwd_wire = counter.bytes(), wire(counter.snapshot())
    mesh.close()
    return {"fwd": fwd, "bwd": bwd, "wire": fwd_wire + bwd_wire}


def formula_per_linear(mode: str, tp: int, depth: int, hidden: int, tokens: int) -> int:
    """Closed-form counted bytes of one Linear, forward + backward, per device."""
    if mode == "1d":  # the pair all-reduces tokens x hidden once per pass
        return hidden * tokens * E if tp > 1 else 0
    q = round((tp // depth) ** 0.5) if mode != "3d" else round(tp ** (1 / 3))
    cost = cp.grid.linear_comm_bytes(
        mode, q, depth=depth, tokens=tokens, in_features=hidden, out_features=hidden
    )
    return cost.total


def _rows_for(world, sizes: list[tuple[int, int, int]]) -> list[dict]:
    rows = []
    for hidden, batch, seq in sizes:
        tokens = batch * seq
        base: dict[int, float] = {}
        for label, (mode, tp, depth) in MODES.items():
            if tp != world.world_size:
                continue
            per_rank = world.run(measure_pair, mode, tp, depth, hidden, batch, seq)
            if len({(r["fwd"], r["bwd"]) for r in per_rank}) != 1:
                raise RuntimeError(f"{label}: ranks counted different bytes: {per_rank}")
            r = per_rank[0]
            measured = (r["fwd"] + r["bwd"]) / 2
            if mode == "1d":
                base[tp] = measured
            formula = formula_per_linear(mode, tp, depth, hidden, tokens)
            rows.append(
                {
                    "mode": label if mode != "1d" else "1d",
                    "devices": tp,
                    "hidden": hidden,
                    "batch x seq": f"{batch}x{seq}",
                    "fwd MiB": r["fwd"] / 2 / 2**20,
                    "bwd MiB": r["bwd"] / 2 / 2**20,
                    "counted MiB": measured / 2**20,
                    "formula MiB": formula / 2**20,
                    "match": measured == formula,
                    "wire MiB": r["wire"] / 2 / 2**20,
                    "counted / 1d": measured / base[tp],
                    "_wire": r["wire"] / 2,
                }
            )
        one_d_wire = next(
            x["_wire"]
            for x in rows
            if x["mode"] == "1d" and x["hidden"] == hidden and x["batch x seq"] == f"{batch}x{seq}"
        )
        for x in rows:
            if x["hidden"] == hidden and x["batch x seq"] == f"{batch}x{seq}":
                x["wire / 1d"] = x["_wire"] / one_d_wire
    return rows


def _extrapolate(hidden: int, batch: int, seq: int) -> list[dict]:
    """Formula-only rows at 64 devices: 1D p=64, 2D 8x8, 2.5D 4x4x4, 3D 4x4x4."""
    tokens, rows = batch * seq, []
    base = formula_per_linear("1d", 64, 1, hidden, tokens)
    wire_factor = {"1d": 2 * 63 / 64, "2d": 7 / 8, "2.5d": 3 / 4, "3d": 3 / 4}
    for mode, depth in (("1d", 1), ("2d", 1), ("2.5d", 4), ("3d", 1)):
        f = formula_per_linear(mode, 64, depth, hidden, tokens)
        rows.append(
            {
                "mode": f"{mode} (formula)",
                "devices": 64,
                "hidden": hidden,
                "batch x seq": f"{batch}x{seq}",
                "formula MiB": f / 2**20,
                "counted / 1d": f / base,
                "wire / 1d": (f * wire_factor[mode]) / (base * wire_factor["1d"]),
            }
        )
    return rows


def run(quick: bool, out_dir: Path) -> Report:
    sizes = [(256, 8, 32)] if quick else [(512, 8, 128), (1024, 16, 128)]
    rows: list[dict] = []
    for n in (4, 8):
        with World(n) as world:
            rows += _rows_for(world, sizes)
    rows.sort(key=lambda r: (r["hidden"], r["batch x seq"], r["devices"]))
    hidden, batch, seq = sizes[-1]
    rows += _extrapolate(hidden, batch, seq)
    for r in rows:
        r.pop("_wire", None)
    measured = [r for r in rows if "match" in r]
    big = [r for r in measured if r["hidden"] == hidden]
    summary = {
        "every measured count equals its formula": all(r["match"] for r in measured),
        **{
            f"{r['mode']} counted/1d ({r['devices']} dev, H={hidden})": r["counted / 1d"]
            for r in big
            if not r["mode"].startswith("1d")
        },
        **{
            f"{r['mode']} wire/1d ({r['devices']} dev, H={hidden})": r["wire / 1d"]
            for r in big
            if not r["mode"].startswith("1d")
        },
        **{
            f"{r['mode']} wire/1d at 64 devices": r["wire / 1d"]
            for r in rows
            if r["devices"] == 64 and not r["mode"].startswith("1d")
        },
    }
    return Report(
        name="tp_comm",
        title="Tensor-parallel communication per device of one Linear (fwd + bwd): 1D vs 2D/2.5D/3D",
        columns=[
            "mode",
            "devices",
            "hidden",
            "batch x seq",
            "fwd MiB",
            "bwd MiB",
            "counted MiB",
            "formula MiB",
            "match",
            "wire MiB",
            "counted / 1d",
            "wire / 1d",
        ],
        rows=rows,
        summary=summary,
        notes=[
            "Measured on gloo over loopback with the mesh's CommCounter; counted bytes are the full "
            "logical tensor of each collective per device (docs/parallel/mesh.md).",
            "Each mode runs a pair of hidden->hidden Linears with bias (1D: column then row); the "
            "table gives per-Linear figures (pair / 2). 1d rows are the baseline at the same "
            "number of devices.",
            "2.5d uses q=2, d=2 and 3d q=2 on 8 devices. Counted (logical) bytes of the "
            "multi-dimensional modes exceed 1D's at q=2, but their collectives run in groups of q, "
            "where a device sends (q-1)/q of the counted bytes, while 1D all-reduces over all p "
            "devices (2(p-1)/p): per-device wire bytes are already below 1D and fall further "
            "with p (rows at 64 devices are closed-form, not measured).",
            "Wire figures of the 64-device formula rows apply (g-1)/g to every collective of a "
            "mode (twice for 1D's all-reduces); the small depth and bias all-reduces of 2.5D/3D are "
            "not doubled there, so those two ratios are slightly optimistic.",
            "No timings: 8 processes on a 2-core CPU say nothing about network time.",
        ],
    )
