"""Rank-side checks of pipeline-parallel GPT and PaLM (run inside a colossal_testing World).

Each case trains the pipelined model 5 AdamW steps next to the unsharded one built with the same
seed, on the same batches, and reports the worst relative errors of the losses, of the first
step's gradients and of the weights after the last step. Under tensor parallelism the expected
shards come from parallelizing copies of the reference ([Note: sharded reference gradients] in
``_checks_models_tp.py``).

[Note: pipeline vs tp] Tensor parallelism alone moves the weights after 5 AdamW steps by ~1e-4
from the unsharded model (its all-reduces sum in another order; AdamW normalises the ~1e-7
gradient differences). So a pp x tp case is also trained against the same tensor-parallel model
without a pipeline, on the same micro-batches: that comparison isolates the pipeline.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist

from colossal_contracts import ConfigError
from colossal_models import GPT, GPTConfig, PaLM, PaLMConfig, parallelize, split_into_stages
from colossal_parallel import MeshConfig, ProcessMesh, all_reduce_grads
from colossal_parallel.pipeline import PipelineSchedule, run_pipeline

B, T, STEPS, LR = 8, 8, 5, 1e-3
LAYERS = 8  # pp = 4 with 2 chunks per rank needs 8 stages

MODELS = {
    # bias=False: the key bias of GPT's fused qkv has an exactly-zero true gradient, so its
    # computed gradient is rounding noise that AdamW normalises into lr-sized steps; any change
    # in summation order (the tied embedding's two halves are summed per step, not per
    # micro-batch) then shows there at ~1e-4 while every other weight agrees to ~1e-7.
    "gpt": lambda: GPT(
        GPTConfig(
            vocab_size=256,
            max_seq_len=T,
            num_layers=LAYERS,
            num_heads=2,
            hidden_size=32,
            bias=False,
        )
    ),
    "palm": lambda: PaLM(
        PaLMConfig(vocab_size=256, max_seq_len=T, num_layers=LAYERS, num_heads=2, hidden_size=32)
    ),
    "palm-untied": lambda: PaLM(
        PaLMConfig(
            vocab_size=256,
            max_seq_len=T,
            num_layers=LAYERS,
            num_heads=2,
            hidden_size=32,
            tie_embeddings=False,
            parallel_block=False,
        )
    ),
}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def _expected(ref: torch.nn.Module, mesh: ProcessMesh, *, grads: bool, opts: dict) -> dict:
    """Reference weights (or gradients), sharded like the pipelined model, by name."""
    src = copy.deepcopy(ref)
    if grads:
        with torch.no_grad():
            for q, r in zip(src.parameters(), ref.parameters()):
                q.copy_(r.grad)
    if mesh.size("tp") > 1:
        parallelize(src, mesh, **opts)
    return {k: v.detach() for k, v in src.named_parameters()}


def _accumulate(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, n: int) -> float:
    """The mean loss of ``n`` equal micro-batches, gradients accumulated one micro-batch at a
    time (the same sums, in the same order, as the pipeline's)."""
    total = 0.0
    for xm, ym in zip(x.chunk(n), y.chunk(n)):
        loss = model(xm, ym) / n
        loss.backward()
        total += loss.item()
    return total


def _named(stages) -> dict[str, torch.nn.Parameter]:
    out: dict[str, torch.nn.Parameter] = {}
    for chunk in stages.chunks:
        out.update(dict(chunk.named_parameters()))
    return out


def run_case(
    model: str, pp: int, dp: int, tp: int, kind: str, m: int, v: int = 1, sp: bool = False
) -> dict:
    """5 AdamW steps of the pipelined model against the unsharded one."""
    mesh = ProcessMesh(MeshConfig(pp=pp, dp=dp, tp=tp))
    opts = {"sequence_parallel": sp}
    torch.manual_seed(0)
    ref = MODELS[model]()
    par = copy.deepcopy(ref)
    tp_only = None
    if tp > 1:
        parallelize(par, mesh, **opts)
        # the same tensor-parallel model without a pipeline, on the same micro-batches: what the
        # pipeline adds to tensor parallelism's own rounding ([Note: pipeline vs tp])
        tp_mesh = ProcessMesh(MeshConfig(dp=dist.get_world_size() // tp, tp=tp))
        tp_only = parallelize(copy.deepcopy(ref), tp_mesh, **opts)
        opt_tp = torch.optim.AdamW(tp_only.parameters(), lr=LR)
    stages = split_into_stages(par, mesh, num_virtual=v)
    schedule = PipelineSchedule(kind, m, v)
    g = torch.Generator().manual_seed(1)
    data = torch.randint(0, 256, (dp * B, T + 1), generator=g)  # trained on: the loss must fall
    mine = slice(mesh.coord("dp") * B, (mesh.coord("dp") + 1) * B)
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=LR)
    opt_par = torch.optim.AdamW(stages.parameters(), lr=LR)
    losses: dict[str, list[float]] = {"ref": [], "par": []}
    grad_err = 0.0
    for step in range(STEPS):
        x, y = data[:, :-1], data[:, 1:]
        opt_ref.zero_grad()
        loss = _accumulate(ref, x, y, dp * m)
        losses["ref"].append(loss)
        if tp_only is not None:
            opt_tp.zero_grad()
            _accumulate(tp_only, x, y, dp * m)
            opt_tp.step()
        opt_par.zero_grad()
        res = run_pipeline(
            stages.chunks,
            mesh,
            schedule,
            x[mine],
            y[mine],
            boundary_shape=stages.boundary_shape(B // m, T),
            tied=stages.tied,
        )
        all_reduce_grads(stages.parameters(), mesh.comm, "dp", average=True)
        losses["par"].append(mesh.comm.all_reduce(res.loss, "dp").item() / dp)
        if step == 0:
            want = _expected(ref, mesh, grads=True, opts=opts)
            for name, q in _named(stages).items():
                grad_err = max(grad_err, _rel(q.grad, want[name]))
        opt_ref.step()
        opt_par.step()
    want = _expected(ref, mesh, grads=False, opts=opts)
    named = _named(stages)
    weight_err = max(_rel(q.detach(), want[name]) for name, q in named.items())
    worst = max(named, key=lambda k: _rel(named[k].detach(), want[k]))
    vs_tp = None
    if tp_only is not None:
        tp_named = dict(tp_only.named_parameters())
        vs_tp = max(_rel(q.detach(), tp_named[k].detach()) for k, q in named.items())
        tp_mesh.close()

    out = {
        "coords": (mesh.coord("pp"), mesh.coord("dp"), mesh.coord("tp")),
        "losses": losses,
        "grad_err": grad_err,
        "weight_err": weight_err,
        "worst": worst,
        "weight_err_vs_tp": vs_tp,
        "num_params": len(named),
        "p2p_bytes": mesh.comm.counter.bytes("pp", "send"),
        "tied": stages.tied[0].detach().clone() if stages.tied else None,
        "layers": [list(r) for r in stages.layers],
    }
    mesh.close()
    return out


def run_cases(cases: list[tuple]) -> list[dict]:
    """``run_case`` for each case, in one world."""
    return [run_case(*c) for c in cases]


def pipeline_errors() -> dict[str, str]:
    """Each bad input raises ConfigError naming the fix, with nothing sent ("ok" + calls)."""
    world = torch.distributed.get_world_size()
    mesh = ProcessMesh(MeshConfig(pp=world))
    torch.manual_seed(0)
    model = MODELS["gpt"]()
    x = torch.randint(0, 256, (B, T))
    out: dict[str, str] = {}

    def attempt(name: str, fn) -> None:
        try:
            fn()
            out[name] = "no error"
        except ConfigError as e:
            out[name] = f"ok ({mesh.comm.counter.calls()} collectives): {e}"

    stages = split_into_stages(model, mesh)
    attempt("more stages than layers", lambda: split_into_stages(model, mesh, num_virtual=LAYERS))
    attempt(
        "micro-batches do not divide the batch",
        lambda: run_pipeline(
            stages.chunks, mesh, PipelineSchedule("1f1b", 3), x, x, boundary_shape=(2, T, 32)
        ),
    )
    attempt(
        "interleaved m not a multiple of pp",
        lambda: run_pipeline(
            stages.chunks,
            mesh,
            PipelineSchedule("interleaved", world + 1, 2),
            x,
            x,
            boundary_shape=(1, T, 32),
        ),
    )
    mesh.close()
    return out
