"""Rank-side checks of long-sequence GPT and PaLM (ring attention, Ulysses; with dp).

Each case trains the sequence-split model 5 AdamW steps next to the unsharded one (same seed,
same batch), gradients summed over ``sp`` and averaged over ``dp``, and reports the worst
relative errors of the losses, the first step's gradients and the final weights.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist

from colossal_contracts import ConfigError
from colossal_models import GPT, GPTConfig, PaLM, PaLMConfig, apply_sequence_parallel
from colossal_parallel import MeshConfig, ProcessMesh, all_reduce_grads

B, T, STEPS, LR = 2, 16, 5, 1e-3

MODELS = {
    # bias=False: see _checks_models_pp.py (the key bias' gradient is pure rounding noise)
    "gpt": lambda: GPT(
        GPTConfig(
            vocab_size=256, max_seq_len=T, num_layers=2, num_heads=4, hidden_size=32, bias=False
        )
    ),
    "palm": lambda: PaLM(
        PaLMConfig(
            vocab_size=256, max_seq_len=T, num_layers=2, num_heads=4, num_kv_heads=2, hidden_size=32
        )
    ),
}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def run_case(model: str, method: str, dp: int) -> dict:
    """5 AdamW steps of the sequence-split model against the unsharded one."""
    sp = dist.get_world_size() // dp
    mesh = ProcessMesh(MeshConfig(dp=dp, sp=sp))
    torch.manual_seed(0)
    ref = MODELS[model]()
    par = apply_sequence_parallel(copy.deepcopy(ref), mesh, method)
    g = torch.Generator().manual_seed(1)
    data = torch.randint(0, 256, (dp * B, T + 1), generator=g)
    x, y = data[:, :-1], data[:, 1:]
    mine = slice(mesh.coord("dp") * B, (mesh.coord("dp") + 1) * B)
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=LR)
    opt_par = torch.optim.AdamW(par.parameters(), lr=LR)
    losses: dict[str, list[float]] = {"ref": [], "par": []}
    grad_err = 0.0
    for step in range(STEPS):
        opt_ref.zero_grad()
        total = 0.0
        for xh, yh in zip(x.chunk(dp), y.chunk(dp)):  # the dp replicas' halves, summed in turn
            loss = ref(xh, yh) / dp
            loss.backward()
            total += loss.item()
        losses["ref"].append(total)
        opt_par.zero_grad()
        loss = par(x[mine], y[mine])
        loss.backward()
        all_reduce_grads(par.parameters(), mesh.comm, "sp", average=False)
        all_reduce_grads(par.parameters(), mesh.comm, "dp", average=True)
        losses["par"].append(mesh.comm.all_reduce(loss.detach(), "dp").item() / dp)
        if step == 0:
            for a, b in zip(par.parameters(), ref.parameters()):
                grad_err = max(grad_err, _rel(a.grad, b.grad))
        opt_ref.step()
        opt_par.step()
    with torch.no_grad():
        logits_err = _rel(par.eval()(x[mine]), ref.eval()(x[mine]))
    out = {
        "losses": losses,
        "grad_err": grad_err,
        "weight_err": max(
            _rel(a.detach(), b.detach()) for a, b in zip(par.parameters(), ref.parameters())
        ),
        "logits_err": logits_err,
        "sp_bytes": mesh.comm.counter.bytes("sp"),
    }
    mesh.close()
    return out


def run_cases(cases: list[tuple]) -> list[dict]:
    """``run_case`` for each ``(model, method, dp)``, in one world."""
    return [run_case(*c) for c in cases]


def plan_errors() -> dict[str, str]:
    """Bad input raises ConfigError naming the fix before any collective."""
    sp = dist.get_world_size()
    mesh = ProcessMesh(MeshConfig(sp=sp))
    out: dict[str, str] = {}

    def attempt(name, fn):
        try:
            fn()
            out[name] = "no error"
        except ConfigError as e:
            out[name] = f"ok ({mesh.comm.counter.calls()} collectives): {e}"

    torch.manual_seed(0)
    odd_heads = GPT(
        GPTConfig(vocab_size=256, max_seq_len=T, num_layers=1, num_heads=1, hidden_size=8)
    )
    attempt(
        "heads not divisible (ulysses)", lambda: apply_sequence_parallel(odd_heads, mesh, "ulysses")
    )
    ring = apply_sequence_parallel(MODELS["gpt"](), mesh, "ring")
    bad = torch.randint(0, 256, (1, 2 * sp + 2))
    attempt("sequence not divisible", lambda: ring(bad, bad))
    attempt("unknown method", lambda: apply_sequence_parallel(MODELS["gpt"](), mesh, "x"))
    mesh.close()
    return out
