"""Mesh-wide gradient norms and overflow: GPT on dp 2 x tp 2 (1D tensor parallelism through
``colossal_models.parallelize``) trained by Gemini and by ZeRO-1/2 with the layout that
``describe_sharding`` reads from the plan. With clipping, the weights replicated across
tensor-parallel ranks stay bit-identical and equal the single-process AdamW model within 1e-5;
with an fp16 overflow forced on one tensor-parallel slice only, every rank skips that step."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist

from colossal_models import GPT, GPTConfig, parallelize
from colossal_models.sharding import describe_sharding, gather_full_state_dict
from colossal_parallel import MeshConfig, ProcessMesh
from colossal_zero import (
    GeminiConfig,
    GeminiOptimizer,
    LossScalerConfig,
    LowLevelZeroOptimizer,
    ZeroConfig,
    apply_gemini,
)

STEPS, BATCH, SEQ, LR, CLIP = 6, 8, 16, 1e-3, 0.05
OVERFLOW_AT = 3  # the step whose gradient is made inf on tensor-parallel coordinate 1 only
# no biases: the key bias gets a zero gradient up to rounding noise, which Adam normalises into
# full-size steps that differ between any two summation orders (TP or not)
CONFIG = GPTConfig(
    vocab_size=128, max_seq_len=SEQ, num_layers=2, num_heads=4, hidden_size=32, bias=False
)


def _model() -> GPT:
    torch.manual_seed(0)
    return GPT(CONFIG)


def _data() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(5)
    return [tuple(torch.randint(0, 128, (2, BATCH, SEQ), generator=g)) for _ in range(STEPS)]  # type: ignore[misc]


def reference(skip: int | None = None) -> tuple[list[float], dict[str, torch.Tensor]]:
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    losses = []
    for i, (x, y) in enumerate(_data()):
        loss = model(x, y)
        loss.backward()
        losses.append(loss.item())
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        if i != skip:
            opt.step()
        opt.zero_grad()
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


def _build(kind: str, precision: str, mesh: ProcessMesh):  # type: ignore[no-untyped-def]
    par = parallelize(copy.deepcopy(_model()), mesh, "1d")
    sharding = describe_sharding(par, mesh)
    dp = mesh.group("dp")
    scaler = LossScalerConfig(init_scale=2.0**8)
    if kind == "gemini":
        gm = apply_gemini(par, GeminiConfig(precision=precision, loss_scaler=scaler), group=dp)
        opt = GeminiOptimizer(gm, lr=LR, max_grad_norm=CLIP, sharding=sharding)
        return par, gm, opt, sharding
    stage = int(kind[-1])
    cfg = ZeroConfig(stage=stage, precision=precision, bucket_numel=4096, loss_scaler=scaler)
    opt = LowLevelZeroOptimizer(
        par, par.parameters(), lr=LR, config=cfg, group=dp, max_grad_norm=CLIP, sharding=sharding
    )
    return par, par, opt, sharding


def _fp32_params(kind: str, model, opt) -> dict[str, torch.Tensor]:  # type: ignore[no-untyped-def]
    full = model.full_state_dict() if kind == "gemini" else opt.full_state_dict()
    return {k: v.float() for k, v in full.items()}


def train_on_mesh(kind: str, precision: str, overflow: bool) -> dict:
    """Runs on each of 4 ranks: replicated weights, losses, skipped steps, unsharded weights."""
    mesh = ProcessMesh(MeshConfig(dp=2, tp=2, tp_mode="1d"))
    par, model, opt, sharding = _build(kind, precision, mesh)
    target = dict(par.named_parameters())["blocks.0.mlp.fc.weight"]  # split along tp
    assert sharding["blocks.0.mlp.fc.weight"].split and sharding["ln_f.weight"].replicated
    half = slice(mesh.coord("dp") * BATCH // 2, (mesh.coord("dp") + 1) * BATCH // 2)
    losses, skipped = [], []
    for i, (x, y) in enumerate(_data()):
        handle = None
        if overflow and i == OVERFLOW_AT and mesh.coord("tp") == 1:
            handle = target.register_hook(lambda g: g * float("inf"))
        loss = model(x[half], y[half])
        opt.backward(loss)
        if handle is not None:
            handle.remove()
        t = loss.detach().float().reshape(1)
        dist.all_reduce(t, group=mesh.group("dp"))
        losses.append(float(t) / 2)
        opt.step()
        opt.zero_grad()
        skipped.append(bool(opt.skipped_last))
    own = _fp32_params(kind, model, opt)
    replicated = {n: own[n] for n, s in sharding.items() if s.replicated}
    plain = parallelize(copy.deepcopy(_model()), mesh, "1d")
    plain.load_state_dict({k: v for k, v in own.items() if k in plain.state_dict()}, strict=False)
    full = gather_full_state_dict(plain, mesh)
    mesh.close()
    return {"replicated": replicated, "losses": losses, "skipped": skipped, "full": full}


def _rel(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[k] - b[k]).norm() / b[k].norm().clamp(min=1e-12)) for k in a)


@pytest.mark.parametrize("kind", ["gemini", "zero1", "zero2"])
def test_clipping_agrees_over_the_mesh(world, kind):
    out = world(4).run(train_on_mesh, kind, "fp32", False)
    ref_losses, ref_weights = reference()
    for r in out[1:]:  # ranks 0,1 and 2,3 are tensor-parallel peers; all four replicate ln etc.
        for n, w in r["replicated"].items():
            assert torch.equal(w, out[0]["replicated"][n]), n
    for r in out:
        for got, want in zip(r["losses"], ref_losses, strict=True):
            assert abs(got - want) <= 1e-5 * abs(want)
        assert _rel(r["full"], ref_weights) <= 1e-5


@pytest.mark.parametrize("kind", ["gemini", "zero1", "zero2"])
def test_fp16_overflow_on_one_tensor_parallel_slice_skips_everywhere(world, kind):
    out = world(4).run(train_on_mesh, kind, "fp16", True)
    want = [i == OVERFLOW_AT for i in range(STEPS)]
    assert all(r["skipped"] == want for r in out)
    for r in out[1:]:
        for n, w in r["replicated"].items():
            assert torch.equal(w, out[0]["replicated"][n]), n
    ref_losses, _ = reference(skip=OVERFLOW_AT)
    for got, want_loss in zip(out[0]["losses"], ref_losses, strict=True):
        assert abs(got - want_loss) <= 3e-2 * abs(want_loss)
