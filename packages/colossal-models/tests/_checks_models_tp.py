"""Rank-side checks of the model tensor-parallel plans (run inside a colossal_testing World).

[Note: sharded reference gradients] Sharding is a pure function of the weights, so the expected
gradient shard of every parameter is obtained by copying the unsharded model's gradients into a
copy of it and parallelizing that copy with the same plan: its parameters are then exactly the
shards of the reference gradients, under the same names as the sharded model's parameters.
"""

from __future__ import annotations

import copy

import torch

from colossal_models import GPT, GPTConfig, PaLM, PaLMConfig, parallelize
from colossal_models.sharding import gather_full_state_dict
from colossal_parallel import MeshConfig, ProcessMesh

B, T, STEPS = 4, 16, 5

MODELS = {
    "gpt": lambda: GPT(
        GPTConfig(vocab_size=256, max_seq_len=32, num_layers=2, num_heads=4, hidden_size=64)
    ),
    "palm": lambda: PaLM(
        PaLMConfig(vocab_size=256, max_seq_len=32, num_layers=2, num_heads=4, hidden_size=64)
    ),
    # sequential blocks, two key/value heads, untied head: the Llama-shaped switches
    "palm-seq": lambda: PaLM(
        PaLMConfig(
            vocab_size=256,
            max_seq_len=32,
            num_layers=2,
            num_heads=4,
            num_kv_heads=2,
            hidden_size=64,
            parallel_block=False,
            tie_embeddings=False,
        )
    ),
    "llama": lambda: PaLM(
        PaLMConfig(
            vocab_size=256,
            max_seq_len=32,
            num_layers=2,
            num_heads=4,
            num_kv_heads=2,
            hidden_size=64,
            parallel_block=False,
            norm="rmsnorm",
            tie_embeddings=False,
        )
    ),
}


def _mesh(mode: str, world: int, dp: int = 1) -> ProcessMesh:
    depth = 2 if mode == "2.5d" else 1
    return ProcessMesh(MeshConfig(dp=dp, tp=world // dp, tp_mode=mode, tp_depth=depth))


def _shard_of_grads(ref: torch.nn.Module, mesh: ProcessMesh, opts: dict) -> dict:
    grads = copy.deepcopy(ref)
    with torch.no_grad():
        for p, g in zip(grads.parameters(), ref.parameters()):
            p.copy_(g.grad)
    parallelize(grads, mesh, **opts)
    return dict(grads.named_parameters())


def run_case(model: str, mode: str, sp: bool = False, ac: bool = False) -> dict:
    """Loss, logits, gradients and 5 AdamW steps of the sharded model vs the unsharded one."""
    import torch.distributed as dist

    mesh = _mesh(mode, dist.get_world_size())
    opts = {"mode": mode, "sequence_parallel": sp, "activation_checkpointing": ac}
    torch.manual_seed(0)
    ref = MODELS[model]()
    par = parallelize(copy.deepcopy(ref), mesh, **opts)
    gathered = gather_full_state_dict(par, mesh)
    gather_exact = gathered.keys() == ref.state_dict().keys() and all(
        torch.equal(gathered[k], v) for k, v in ref.state_dict().items()
    )
    g = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, 256, (2, B, T), generator=g)
    batch = torch.randint(0, 256, (B, T + 1), generator=g)  # trained on: the loss must fall

    with torch.no_grad():
        logits_err = (par.eval()(x) - ref.eval()(x)).abs().max().item()
    par.train(), ref.train()
    loss_ref, loss_par = ref(x, y), par(x, y)
    loss_ref.backward()
    loss_par.backward()
    expected = _shard_of_grads(ref, mesh, opts)
    grad_err, checked = 0.0, 0
    for name, p in par.named_parameters():
        if not p.requires_grad:
            continue
        e = expected[name]
        grad_err = max(grad_err, ((p.grad - e).abs().max() / e.abs().max().clamp(min=1e-12)).item())
        checked += 1

    losses = {}
    for tag, m in (("ref", ref), ("par", par)):
        m.zero_grad(set_to_none=True)
        opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=3e-3)
        out = []
        for _ in range(STEPS):
            loss = m(batch[:, :-1], batch[:, 1:])
            opt.zero_grad()
            loss.backward()
            opt.step()
            out.append(loss.item())
        losses[tag] = out
    # the trained shards put back together make an unsharded model computing the same loss
    full = gather_full_state_dict(par, mesh)
    merged = MODELS[model]()
    merged.load_state_dict(full)
    with torch.no_grad():
        xb, yb = batch[:, :-1], batch[:, 1:]
        merged_err = abs(merged.eval()(xb, yb).item() - par.eval()(xb, yb).item())
    mesh.close()
    return {
        "sp_layers": sum(bool(getattr(m, "sequence_parallel", False)) for m in par.modules()),
        "ac_blocks": sum(
            bool(getattr(m, "activation_checkpointing", False)) for m in par.modules()
        ),
        "numel": (
            sum(p.numel() for p in ref.parameters()),
            sum(p.numel() for p in par.parameters()),
        ),
        "loss": (loss_ref.item(), loss_par.item()),
        "logits_err": logits_err,
        "grad_err": grad_err,
        "gather_exact": gather_exact,
        "merged_err": merged_err,
        "num_params_checked": checked,
        "losses": losses,
    }


def run_dp_case(model: str, mode: str) -> dict:
    """Two data-parallel replicas of a tensor-parallel model, each on half the batch, with
    gradients averaged over ``dp``: the unsharded model's loss and gradient shards."""
    import torch.distributed as dist

    mesh = _mesh(mode, dist.get_world_size(), dp=2)
    torch.manual_seed(0)
    ref = MODELS[model]()
    par = parallelize(copy.deepcopy(ref), mesh, mode)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, 256, (2, 2 * B, T), generator=g)
    loss_ref = ref(x, y)
    loss_ref.backward()
    half = slice(mesh.coord("dp") * B, (mesh.coord("dp") + 1) * B)
    loss = par(x[half], y[half])
    loss.backward()
    group = mesh.group("dp")
    mean_loss = loss.detach().clone()
    dist.all_reduce(mean_loss, group=group)
    grad_err = 0.0
    expected = _shard_of_grads(ref, mesh, {"mode": mode})
    for name, p in par.named_parameters():
        if p.requires_grad:
            dist.all_reduce(p.grad, group=group)
            p.grad /= 2
            e = expected[name]
            err = (p.grad - e).abs().max() / e.abs().max().clamp(min=1e-12)
            grad_err = max(grad_err, err.item())
    mesh.close()
    return {"loss": (loss_ref.item(), mean_loss.item() / 2), "grad_err": grad_err}


def run_cases(cases: list[tuple]) -> list[dict]:
    """``run_case`` for each ``(model, mode, sp, ac)``, in one world."""
    return [run_case(*c) for c in cases]


def plan_errors() -> dict[str, str]:
    """The ``ConfigError`` message of each misuse, raised before any collective."""
    import torch.distributed as dist

    from colossal_contracts import ConfigError

    world = dist.get_world_size()
    mesh = _mesh("1d" if world == 2 else "2d", world)
    other = "2d" if world == 2 else "1d"
    tiny = dict(vocab_size=256, max_seq_len=32, num_layers=1)
    attempts = {
        "mode": lambda: parallelize(MODELS["gpt"](), mesh, other),
        "model": lambda: parallelize(torch.nn.Linear(2, 2), mesh),
        "heads": lambda: parallelize(GPT(GPTConfig(**tiny, num_heads=3, hidden_size=96)), mesh),
        "kv": lambda: parallelize(
            PaLM(PaLMConfig(**tiny, num_heads=6, num_kv_heads=3, hidden_size=96)), mesh
        ),
        "sp": lambda: parallelize(MODELS["palm"](), mesh, sequence_parallel=True),
        "rmsnorm": lambda: parallelize(MODELS["llama"](), mesh),
    }
    messages = {}
    for name, attempt in attempts.items():
        try:
            attempt()
            messages[name] = "no error"
        except ConfigError as exc:
            messages[name] = str(exc)
    mesh.close()
    return messages


def hf_llama_under_tp(sequence_parallel: bool) -> tuple[float, bool]:
    """Max |logits| difference between a random HF Llama and our converted copy under 1d, and
    whether the shards gathered and converted back are HF's state dict exactly."""
    import torch.distributed as dist
    import transformers

    from colossal_models.hf import LlamaStateDictAdapter

    torch.manual_seed(0)
    hf_cfg = transformers.LlamaConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=1,
        intermediate_size=96, vocab_size=256, max_position_embeddings=64, bos_token_id=0,
        eos_token_id=0,
    )  # fmt: skip
    hf = transformers.LlamaForCausalLM(hf_cfg).eval()
    adapter = LlamaStateDictAdapter(LlamaStateDictAdapter.config_from_hf(hf.config))
    ours = PaLM(adapter.config)
    ours.load_state_dict(adapter.from_hf(hf.state_dict()))
    mesh = _mesh("1d", dist.get_world_size())
    parallelize(ours, mesh, sequence_parallel=sequence_parallel).eval()
    idx = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        err = (ours(idx) - hf(idx).logits).abs().max().item()
    back = adapter.to_hf(gather_full_state_dict(ours, mesh))
    exact = back.keys() == hf.state_dict().keys() and all(
        torch.equal(v, hf.state_dict()[k]) for k, v in back.items()
    )
    mesh.close()
    return err, exact
