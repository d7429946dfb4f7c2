"""Rank-side checks of the 2D, 2.5D and 3D layers (run inside a colossal_testing World).

Each public function builds one mesh and runs many checks in it, returning plain numbers so the
test process asserts. References are computed on every rank with the same seed (no collectives).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from _tp_multid_model import SEQ, VOCAB, ParModel, RefModel
from torch import nn

import colossal_parallel as cp
from colossal_contracts import ConfigError
from colossal_parallel import MeshConfig, ProcessMesh

B, S, K, N, V = 4, 3, 8, 12, 16  # batch, seq, in/out features, vocabulary


# mode: (class-name suffix, mesh config, activation layouts (first: default), q, depth);
# sizes this machine can host
KITS = {
    "2d": ("2D", MeshConfig(tp=4, tp_mode="2d"), (cp.grid.LAYOUT_2D,), 2, 1),
    "2.5d": ("2p5D", MeshConfig(tp=8, tp_mode="2.5d", tp_depth=2), (cp.grid.LAYOUT_2P5D,), 2, 2),
    "3d": ("3D", MeshConfig(tp=8, tp_mode="3d"), (cp.grid.LAYOUT_3D, cp.grid.LAYOUT_3D_T), 2, 1),
}


def num_ranks(mode: str) -> int:
    """The world size the mode's checks run on."""
    return KITS[mode][1].world_size


def kit(mode: str) -> dict:
    """The layers, layouts and mesh config of a mode."""
    up, cfg, layouts, q, d = KITS[mode]
    ce = getattr(cp.grid, f"cross_entropy_{up.lower()}")
    return {
        "cfg": cfg,
        "q": q,
        "depth": d,
        "layout": layouts[0],
        "layouts": layouts,
        **{
            k: getattr(cp.grid, f"{k}{up}")
            for k in ("Linear", "Classifier", "LayerNorm", "Embedding", "VocabParallelEmbedding")
        },
        "cross_entropy": (lambda lg, t, m, lay: ce(lg, t, m, layout=lay))
        if mode == "3d"
        else (lambda lg, t, m, lay: ce(lg, t, m)),
    }


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def _measure(comm, fwd, loss_of):
    """Run ``fwd()``, then backward of ``loss_of(out)``; counted bytes of each pass."""
    comm.counter.reset()
    out = fwd()
    f = comm.counter.bytes()
    comm.counter.reset()
    loss_of(out).backward()
    return out, f, comm.counter.bytes()


def _check_linear(mesh, k, cls, layout, results, tag, *, in_f=K, out_f=N, bias=True):
    torch.manual_seed(1)
    ref = nn.Linear(in_f, out_f, bias=bias)
    x = torch.randn(B, S, in_f, requires_grad=True)
    g = torch.randn(B, S, out_f)
    y = ref(x)
    (y * g).sum().backward()
    par = cls.from_linear(ref, mesh, layout=layout)
    xl = cp.grid.split_to_layout(x.detach(), mesh, layout).requires_grad_()
    gl = cp.grid.split_to_layout(g, mesh, par.out_layout)
    yl, fb, bb = _measure(mesh.comm, lambda: par(xl), lambda o: (o * gl).sum())
    grad_ref = nn.Linear(in_f, out_f, bias=bias)
    with torch.no_grad():
        grad_ref.weight.copy_(ref.weight.grad)
        if bias:
            grad_ref.bias.copy_(ref.bias.grad)
    expect = cls.from_linear(grad_ref, mesh, layout=layout)
    err = {
        "out": _rel(yl, cp.grid.split_to_layout(y.detach(), mesh, par.out_layout)),
        "dx": _rel(xl.grad, cp.grid.split_to_layout(x.grad, mesh, layout)),
        "dw": _rel(par.weight.grad, expect.weight),
    }
    if bias:
        err["db"] = _rel(par.bias.grad, expect.bias)
    cost = cp.grid.linear_comm_bytes(
        mesh.config.tp_mode,
        k["q"],
        depth=k["depth"],
        tokens=B * S,
        in_features=in_f,
        out_features=out_f,
        bias=bias,
    )
    results[tag] = {"err": err, "bytes": (fb, bb), "formula": (cost.forward, cost.backward)}


def _check_layernorm(mesh, k, layout, results, tag):
    torch.manual_seed(2)
    ref = nn.LayerNorm(N)
    with torch.no_grad():
        ref.weight.uniform_(0.5, 1.5)
        ref.bias.uniform_(-0.5, 0.5)
    x = (torch.randn(B, S, N) * 3 + 1).requires_grad_()
    g = torch.randn(B, S, N)
    y = ref(x)
    (y * g).sum().backward()
    par = k["LayerNorm"].from_layernorm(ref, mesh, layout=layout)
    xl = cp.grid.split_to_layout(x.detach(), mesh, layout).requires_grad_()
    gl = cp.grid.split_to_layout(g, mesh, layout)
    yl, fb, bb = _measure(mesh.comm, lambda: par(xl), lambda o: (o * gl).sum())
    grad_ref = nn.LayerNorm(N)
    with torch.no_grad():
        grad_ref.weight.copy_(ref.weight.grad)
        grad_ref.bias.copy_(ref.bias.grad)
    expect = k["LayerNorm"].from_layernorm(grad_ref, mesh, layout=layout)
    cost = cp.grid.layernorm_comm_bytes(
        mesh.config.tp_mode, k["q"], depth=k["depth"], tokens=B * S, hidden=N
    )
    results[tag] = {
        "err": {
            "out": _rel(yl, cp.grid.split_to_layout(y.detach(), mesh, layout)),
            "dx": _rel(xl.grad, cp.grid.split_to_layout(x.grad, mesh, layout)),
            "dw": _rel(par.weight.grad, expect.weight),
            "db": _rel(par.bias.grad, expect.bias),
        },
        "bytes": (fb, bb),
        "formula": (cost.forward, cost.backward),
    }


def _check_embedding(mesh, k, layout, results, tag, vocab_parallel: bool):
    torch.manual_seed(3)
    ref = nn.Embedding(V, N)
    ids = torch.randint(0, V, (B, S))
    g = torch.randn(B, S, N)
    y = ref(ids)
    (y * g).sum().backward()
    cls = k["VocabParallelEmbedding" if vocab_parallel else "Embedding"]
    par = cls.from_embedding(ref, mesh, layout=layout)
    il = cp.grid.split_to_layout(ids, mesh, layout, hidden=False)
    gl = cp.grid.split_to_layout(g, mesh, layout)
    yl, fb, bb = _measure(mesh.comm, lambda: par(il), lambda o: (o * gl).sum())
    grad_ref = nn.Embedding(V, N)
    with torch.no_grad():
        grad_ref.weight.copy_(ref.weight.grad)
    expect = cls.from_embedding(grad_ref, mesh, layout=layout)
    mode, q, d = mesh.config.tp_mode, k["q"], k["depth"]
    if vocab_parallel:
        cost = cp.grid.vocab_embedding_comm_bytes(
            mode, q, depth=d, tokens=B * S, num_embeddings=V, dim=N
        )
    else:
        cost = cp.grid.embedding_comm_bytes(mode, q, depth=d, num_embeddings=V, dim=N)
    results[tag] = {
        "err": {
            "out": _rel(yl, cp.grid.split_to_layout(y.detach(), mesh, layout)),
            "dw": _rel(par.weight.grad, expect.weight),
        },
        "bytes": (fb, bb),
        "formula": (cost.forward, cost.backward),
    }


def _check_head(mesh, k, layout, results, tag):
    """Classifier + vocabulary-parallel cross-entropy against F.cross_entropy."""
    torch.manual_seed(4)
    ref = nn.Linear(K, V, bias=False)
    x = torch.randn(B, S, K, requires_grad=True)
    targets = torch.randint(0, V, (B, S))
    loss = F.cross_entropy(ref(x).reshape(-1, V), targets.reshape(-1))
    loss.backward()
    par = k["Classifier"].from_linear(ref, mesh, layout=layout)
    xl = cp.grid.split_to_layout(x.detach(), mesh, layout).requires_grad_()
    logits = par(xl)
    tl = cp.grid.split_to_layout(targets, mesh, par.out_layout, hidden=False)
    ce = k["cross_entropy"]
    leaf = logits.detach().requires_grad_()  # count the cross-entropy alone
    lossl, fb, bb = _measure(mesh.comm, lambda: ce(leaf, tl, mesh, par.out_layout), lambda o: o)
    logits.backward(leaf.grad)
    grad_ref = nn.Linear(K, V, bias=False)
    with torch.no_grad():
        grad_ref.weight.copy_(ref.weight.grad)
    expect = k["Classifier"].from_linear(grad_ref, mesh, layout=layout)
    cost = cp.grid.cross_entropy_comm_bytes(
        mesh.config.tp_mode, k["q"], depth=k["depth"], tokens=B * S
    )
    results[tag] = {
        "err": {
            "loss": _rel(lossl, loss.detach()),
            "dx": _rel(xl.grad, cp.grid.split_to_layout(x.grad, mesh, layout)),
            "dw": _rel(par.weight.grad, expect.weight),
        },
        "bytes": (fb, bb),
        "formula": (cost.forward, cost.backward),
    }


def _check_errors(mesh, k) -> dict:
    """Every invalid size raises ConfigError, and no collective has run when it does."""
    lay = k["layout"]
    q = k["q"]
    good = k["Linear"](K, N, mesh, layout=lay)
    other = "3d" if mesh.config.tp_mode != "3d" else "2d"
    cases = {
        "in_features": lambda: k["Linear"](K + 1, N, mesh, layout=lay),
        "out_features": lambda: k["Linear"](K, N + 1, mesh, layout=lay),
        "bias": lambda: k["Linear"](K, q * q * 3 + q, mesh, layout=lay),
        "layernorm": lambda: k["LayerNorm"](q * q + 1, mesh, layout=lay),
        "embedding_dim": lambda: k["Embedding"](V, N + 1, mesh, layout=lay),
        "vocab": lambda: k["VocabParallelEmbedding"](V + 1, N, mesh, layout=lay),
        "input_width": lambda: good(torch.randn(1, S, 3)),
        "batch": lambda: cp.grid.split_to_layout(torch.randn(B + 1, S, K), mesh, lay),
        "ids_dtype": lambda: k["Embedding"](V, N, mesh, layout=lay)(torch.zeros(1, S)),
        "layout": lambda: k["Linear"](K, N, mesh, layout=cp.grid.TpLayout(("dp",), "pp")),
        "mode": lambda: getattr(cp.grid, "Linear3D" if other == "3d" else "Linear2D")(K, N, mesh),
    }
    out = {}
    for name, fn in cases.items():
        mesh.comm.counter.reset()
        try:
            fn()
            out[name] = "no error"
        except ConfigError as e:
            calls = mesh.comm.counter.calls()
            out[name] = f"ok ({calls} collectives): {e}" if calls == 0 else f"{calls} calls: {e}"
    return out


def run_layers(mode: str) -> dict:
    """Forward/gradient errors, counted vs formula bytes, and error checks of every layer."""
    k = kit(mode)
    mesh = ProcessMesh(k["cfg"])
    results: dict = {}
    for i, lay in enumerate(k["layouts"]):
        sfx = f"@{i}"
        _check_linear(mesh, k, k["Linear"], lay, results, f"linear{sfx}")
        _check_linear(mesh, k, k["Linear"], lay, results, f"linear_nobias{sfx}", bias=False)
        _check_layernorm(mesh, k, lay, results, f"layernorm{sfx}")
        _check_embedding(mesh, k, lay, results, f"embedding{sfx}", vocab_parallel=False)
        _check_embedding(mesh, k, lay, results, f"vocab_embedding{sfx}", vocab_parallel=True)
        _check_head(mesh, k, lay, results, f"head{sfx}")
    results["errors"] = _check_errors(mesh, k)
    # a round trip through the split/gather helpers
    x = torch.randn(B, S, N, generator=torch.Generator().manual_seed(5))
    back = cp.grid.gather_from_layout(
        cp.grid.split_to_layout(x, mesh, k["layout"]), mesh, k["layout"]
    )
    results["roundtrip"] = _rel(back, x)
    mesh.close()
    return results


def run_training(mode: str, steps: int = 5) -> dict:
    """Losses of the two-block transformer, unsharded vs sharded, over ``steps`` SGD steps."""
    k = kit(mode)
    mesh = ProcessMesh(k["cfg"])
    torch.manual_seed(0)
    ref = RefModel()
    par = ParModel(ref, mesh, k)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.5)
    opt_par = torch.optim.SGD(par.parameters(), lr=0.5)
    data = torch.Generator().manual_seed(7)
    pos = torch.arange(SEQ).expand(B, SEQ)
    ref_losses, par_losses = [], []
    ids = torch.randint(0, VOCAB, (B, SEQ), generator=data)  # one batch, so the loss must fall
    targets = torch.randint(0, VOCAB, (B, SEQ), generator=data)
    for _ in range(steps):
        opt_ref.zero_grad()
        loss = ref.loss(ids, pos, targets)
        loss.backward()
        opt_ref.step()
        ref_losses.append(loss.item())
        opt_par.zero_grad()
        lay, out_lay = par.layout, par.head.out_layout
        lp = par.loss(
            cp.grid.split_to_layout(ids, mesh, lay, hidden=False),
            cp.grid.split_to_layout(pos, mesh, lay, hidden=False),
            cp.grid.split_to_layout(targets, mesh, out_lay, hidden=False),
        )
        lp.backward()
        opt_par.step()
        par_losses.append(lp.item())
    # weights after training: every shard equals the same shard of the trained reference
    trained = ParModel(ref, mesh, k)
    weight_err = max(
        _rel(a.detach(), b.detach()) for a, b in zip(par.parameters(), trained.parameters())
    )
    n_local = sum(p.numel() for p in par.parameters())
    mesh.close()
    return {
        "ref": ref_losses,
        "par": par_losses,
        "weight_err": weight_err,
        "params_local": n_local,
        "params_ref": sum(p.numel() for p in ref.parameters()),
    }
