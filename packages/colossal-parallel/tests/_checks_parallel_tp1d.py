"""Rank-side checks of the 1D layers and sequence parallelism against unsharded references."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from colossal_parallel import MeshConfig, ProcessMesh
from colossal_parallel.tp1d import (
    ColumnParallelLinear,
    LayerNorm1D,
    ParallelEmbedding,
    RowParallelLinear,
    VocabParallelEmbedding,
    VocabParallelLMHead,
    gather_sequence,
    split_sequence,
    vocab_parallel_cross_entropy,
)

B, S, H, OUT, V = 2, 8, 16, 24, 32  # batch, sequence, hidden, out features, vocabulary


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """Norm-wise relative error of ``a`` against the reference ``b``."""
    return ((a.double() - b.double()).norm() / b.double().norm().clamp(min=1e-30)).item()


def _shard(t: torch.Tensor, p: int, c: int, dim: int) -> torch.Tensor:
    return t.chunk(p, dim=dim)[c]


def _run(
    mesh: ProcessMesh,
    ref: nn.Module,
    par: nn.Module,
    x_ref: torch.Tensor,
    x_par: torch.Tensor,
    y_to_par: Callable[[torch.Tensor], torch.Tensor],
    x_grad_to_par: Callable[[torch.Tensor], torch.Tensor],
    params: dict[str, Callable[[torch.Tensor], torch.Tensor]],
) -> dict:
    """Forward/backward both; compare output, input grad and each parameter grad (ref -> shard)."""
    torch.manual_seed(123)
    y_ref = ref(x_ref)
    w = torch.randn_like(y_ref)  # the same on every rank: loss = sum(y * w)
    (y_ref * w).sum().backward()
    mesh.comm.counter.reset()
    y_par = par(x_par)
    fwd = mesh.comm.counter.snapshot()
    (y_par * y_to_par(w)).sum().backward()
    errs = {"out": rel_err(y_par, y_to_par(y_ref.detach()))}
    if x_ref.is_floating_point():
        errs["grad_in"] = rel_err(x_par.grad, x_grad_to_par(x_ref.grad))
    for name, to_par in params.items():
        errs[f"grad_{name}"] = rel_err(getattr(par, name).grad, to_par(getattr(ref, name).grad))
    total = mesh.comm.counter.snapshot()
    return {"errs": errs, "fwd": fwd, "total": total}


def layer_checks(seq_parallel: bool) -> dict[str, dict]:
    """Every 1D layer against its unsharded module; with ``seq_parallel`` the SP variants."""
    p = torch.distributed.get_world_size()
    mesh = ProcessMesh(MeshConfig(tp=p))
    c = mesh.coord("tp")
    sp = seq_parallel
    ident = lambda t: t  # noqa: E731
    seq = (lambda t: _shard(t, p, c, 1)) if sp else ident  # (B, S, .) -> this rank's tokens
    out: dict[str, dict] = {}

    def fresh(*shape: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(*shape)
        return x.clone().requires_grad_(True), seq(x).clone().requires_grad_(True)

    torch.manual_seed(0)
    lin = nn.Linear(H, OUT)
    x_ref, x_par = fresh(B, S, H)
    col = ColumnParallelLinear.from_linear(lin, mesh, sequence_parallel=sp)
    out["column"] = _run(
        mesh,
        lin,
        col,
        x_ref,
        x_par,
        lambda t: _shard(t, p, c, -1),
        seq,
        {"weight": lambda g: _shard(g, p, c, 0), "bias": lambda g: _shard(g, p, c, 0)},
    )
    if not sp:
        lin.zero_grad()
        x_ref, x_par = fresh(B, S, H)
        colg = ColumnParallelLinear.from_linear(lin, mesh, gather_output=True)
        out["column_gather"] = _run(
            mesh,
            lin,
            colg,
            x_ref,
            x_par,
            ident,
            ident,
            {"weight": lambda g: _shard(g, p, c, 0), "bias": lambda g: _shard(g, p, c, 0)},
        )
        lin.zero_grad()
        x_ref, x_par = fresh(B, S, H)
        rowf = RowParallelLinear.from_linear(lin, mesh, input_is_parallel=False)
        out["row_full_input"] = _run(
            mesh,
            lin,
            rowf,
            x_ref,
            x_par,
            ident,
            ident,
            {"weight": lambda g: _shard(g, p, c, 1), "bias": ident},
        )

    torch.manual_seed(1)
    lin = nn.Linear(OUT, H)
    x = torch.randn(B, S, OUT)
    x_ref = x.clone().requires_grad_(True)
    x_par = _shard(x, p, c, -1).clone().requires_grad_(True)
    row = RowParallelLinear.from_linear(lin, mesh, sequence_parallel=sp)
    out["row"] = _run(
        mesh,
        lin,
        row,
        x_ref,
        x_par,
        seq,
        lambda g: _shard(g, p, c, -1),
        {"weight": lambda g: _shard(g, p, c, 1), "bias": ident},
    )

    torch.manual_seed(2)
    norm = nn.LayerNorm(H)
    with torch.no_grad():
        norm.weight.add_(torch.randn(H) * 0.1)
        norm.bias.add_(torch.randn(H) * 0.1)
    x_ref, x_par = fresh(B, S, H)
    ln = LayerNorm1D.from_layernorm(norm, mesh, sequence_parallel=sp)
    out["layernorm"] = _run(
        mesh, norm, ln, x_ref, x_par, seq, seq, {"weight": ident, "bias": ident}
    )

    torch.manual_seed(3)
    emb = nn.Embedding(V, H)
    ids = torch.randint(0, V, (B, S))
    vemb = VocabParallelEmbedding.from_embedding(emb, mesh, sequence_parallel=sp)
    out["vocab_embedding"] = _run(
        mesh, emb, vemb, ids, ids, seq, ident, {"weight": lambda g: _shard(g, p, c, 0)}
    )
    if not sp:
        emb.zero_grad()
        pemb = ParallelEmbedding.from_embedding(emb, mesh)
        out["embedding"] = _run(
            mesh, emb, pemb, ids, ids, ident, ident, {"weight": lambda g: _shard(g, p, c, 1)}
        )

    # LM head + vocabulary-parallel cross-entropy against F.cross_entropy of the full logits
    torch.manual_seed(4)
    head_ref = nn.Linear(H, V, bias=False)
    head = VocabParallelLMHead.from_linear(head_ref, mesh, sequence_parallel=sp)
    x_ref, x_par = fresh(B, S, H)
    target = torch.randint(0, V, (B, S))
    target[0, :3] = -100  # ignored tokens
    (F.cross_entropy(head_ref(x_ref).reshape(-1, V), target.reshape(-1)) * 3.0).backward()
    mesh.comm.counter.reset()
    logits = head(x_par)  # (B, S, V/p): full sequence even under SP
    head_fwd = mesh.comm.counter.snapshot()
    mesh.comm.counter.reset()
    loss = vocab_parallel_cross_entropy(logits, target, mesh)
    ce_fwd = mesh.comm.counter.snapshot()
    (loss * 3.0).backward()
    want = F.cross_entropy(head_ref(x_ref).reshape(-1, V), target.reshape(-1))
    none = vocab_parallel_cross_entropy(logits.detach(), target, mesh, reduction="none")
    want_none = F.cross_entropy(
        head_ref(x_ref).detach().reshape(-1, V), target.reshape(-1), reduction="none"
    ).reshape(B, S)
    out["lm_head_ce"] = {
        "errs": {
            "loss": rel_err(loss.detach(), want.detach()),
            "loss_none": rel_err(none, want_none),
            "grad_in": rel_err(x_par.grad, seq(x_ref.grad)),
            "grad_weight": rel_err(head.weight.grad, _shard(head_ref.weight.grad, p, c, 0)),
        },
        "fwd": head_fwd,
        "ce_fwd": ce_fwd,
    }

    # split/gather helpers round trip
    x = torch.randn(B, S, H, requires_grad=True)
    mesh.comm.counter.reset()
    y = gather_sequence(split_sequence(x, mesh) * 2.0, mesh)
    y.sum().backward()
    out["sequence_helpers"] = {
        "errs": {
            "out": rel_err(y, 2 * x.detach()),
            "grad_in": rel_err(x.grad, torch.full_like(x, 2.0)),
        },
        "total": mesh.comm.counter.snapshot(),
    }
    mesh.close()
    return out


def bad_sizes() -> dict[str, str]:
    """Constructors reject splits that do not divide, before any communication."""
    p = torch.distributed.get_world_size()
    mesh = ProcessMesh(MeshConfig(tp=p))
    msgs: dict[str, str] = {}
    cases = {
        "column": lambda: ColumnParallelLinear(8, 4 * p + 1, mesh),
        "row": lambda: RowParallelLinear(4 * p + 1, 8, mesh),
        "vocab": lambda: VocabParallelEmbedding(4 * p + 1, 8, mesh),
        "embedding": lambda: ParallelEmbedding(10, 4 * p + 1, mesh),
        "sequence": lambda: split_sequence(torch.zeros(2, 4 * p + 1, 3), mesh),
        "axis": lambda: ColumnParallelLinear(8, 8, mesh, axis="tp_row"),
        "reduce_scatter": lambda: mesh.comm.reduce_scatter(torch.zeros(4 * p + 1), "tp"),
        "all_to_all": lambda: mesh.comm.all_to_all(torch.zeros(3, 4 * p + 1), "tp", 1, 0),
        "cross_entropy": lambda: vocab_parallel_cross_entropy(
            torch.zeros(2, 3, V // p), torch.zeros(2, 4, dtype=torch.long), mesh
        ),
    }
    before = mesh.comm.counter.calls()
    for name, make in cases.items():
        try:
            make()
            msgs[name] = ""
        except ValueError as e:
            msgs[name] = str(e)
    msgs["calls"] = str(mesh.comm.counter.calls() - before)
    t = torch.ones(1)
    torch.distributed.all_reduce(t)  # every rank is still in step
    msgs["world"] = str(int(t.item()))
    mesh.close()
    return msgs


def train_transformer(seq_parallel: bool, steps: int = 5) -> dict:
    """Train the two-block GPT unsharded and 1D-parallel from the same weights and data."""
    import _model_parallel_tp1d as gpt

    p = torch.distributed.get_world_size()
    mesh = ProcessMesh(MeshConfig(tp=p))
    c = mesh.coord("tp")
    torch.manual_seed(0)
    ref = gpt.GPT()
    par = gpt.GPT1D(ref, mesh, seq_parallel)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    opt_par = torch.optim.SGD(par.parameters(), lr=0.1, momentum=0.9)
    gen = torch.Generator().manual_seed(1)
    losses_ref, losses_par, per_step_bytes = [], [], []
    for _ in range(steps):
        ids = torch.randint(0, gpt.V, (2, gpt.T), generator=gen)
        target = torch.roll(ids, -1, dims=1)
        for model, opt, losses in ((ref, opt_ref, losses_ref), (par, opt_par, losses_par)):
            opt.zero_grad()
            mesh.comm.counter.reset()
            loss = model(ids, target)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        per_step_bytes.append(mesh.comm.counter.snapshot())
    # every trained parameter against the matching slice of the reference
    ref_p = dict(ref.named_parameters())
    errs = {}
    for name, prm in par.named_parameters():
        want = ref_p["pos.weight"] if name == "pos" else ref_p[name]
        if want.shape != prm.shape:  # sharded: find the split dim
            dim = next(d for d in range(want.dim()) if want.shape[d] != prm.shape[d])
            want = _shard(want, p, c, dim)
        errs[name] = rel_err(prm.detach(), want.detach())
    mesh.close()
    return {
        "losses_ref": losses_ref,
        "losses_par": losses_par,
        "param_errs": errs,
        "num_ref_params": len(ref_p),
        "bytes": per_step_bytes,
    }
