"""Rank-side checks of ``HybridParallelPlugin`` and ``GeminiPlugin(tp_size=...)`` (run inside a
colossal_testing World).

Each case trains GPT (no biases: see [Note: pipeline vs tp] in colossal-models' pipeline checks)
through the Booster next to the unsharded single-process model with ``torch.optim.AdamW`` and
the same clipping, on the same global batches, and reports the worst error of the losses and of
the weights after the last step. The reference weights are sharded the way the plugin sharded
the model (``parallelize`` of a copy on the same mesh), so each rank compares what it holds.
Weight error is per parameter ``|w - ref| / |ref|`` (Frobenius norms), the worst parameter.
``dtype="float64"`` runs model and reference in double precision (with ZeRO or Gemini the
plugin's ``precision="fp64"`` keeps their states in float64 too). ``low_precision_case`` judges
bf16/fp16 runs as colossal-zero's tests do ([Note: bf16 tolerance] there): losses within 3e-2
of fp32 AdamW's, each tensor within a quarter of fp32 training's displacement of it.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
import torch.distributed as dist
from _stack_reference import adamw_losses

from colossal import Booster, GeminiPlugin, HybridParallelPlugin, lazy_init
from colossal._capability import megatron_sequence
from colossal.booster import load_sharded_safetensors
from colossal_contracts import ConfigError
from colossal_models import GPT, GPTConfig, parallelize

B, T, LR, CLIP = 8, 16, 1e-3, 0.05


def _model(layers: int, dtype: str = "float32") -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig(
        vocab_size=128, max_seq_len=T, num_layers=layers, num_heads=4, hidden_size=32, bias=False
    )
    return GPT(cfg).to(getattr(torch, dtype))


def batches(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(3)
    out = []
    for _ in range(steps):
        d = torch.randint(0, 128, (B, T + 1), generator=g)
        out.append((d[:, :-1], d[:, 1:]))
    return out


def _reference(layers: int, steps: int, m: int, dtype: str = "float32") -> tuple[list[float], GPT]:
    """Single-process AdamW on the global batch (gradients of ``m`` equal micro-batches summed,
    as the pipeline sums them), clipped at ``CLIP``."""
    ref = _model(layers, dtype)
    return adamw_losses(ref, batches(steps), LR, clip=CLIP, microbatches=m), ref


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


def _mean_over_dp(loss: torch.Tensor, group: dist.ProcessGroup, dp: int) -> float:
    t = loss.detach().double().reshape(1)
    dist.all_reduce(t, group=group)
    return float(t) / dp


def _errors(
    losses: list[float], ref_losses: list[float], got: dict[str, torch.Tensor], want: GPT
) -> dict:
    """Worst relative loss error and worst per-parameter weight error (``got`` by the names of
    the sharded model; ``want`` the reference sharded the same way)."""
    params = dict(want.named_parameters())
    errs = {n: _rel(v.detach().to(params[n].dtype), params[n].detach()) for n, v in got.items()}
    worst = max(errs, key=errs.__getitem__)
    loss_err = max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses, strict=True))
    return {
        "loss_err": loss_err,
        "weight_err": errs[worst],
        "worst": worst,
        "num_params": len(errs),
    }


def _hybrid_run(settings: dict, steps: int, layers: int, dtype: str) -> tuple:
    """``steps`` Booster steps of ``HybridParallelPlugin(**settings)``: plugin, model,
    optimizer, the global mean loss of each step."""
    plugin = HybridParallelPlugin(max_grad_norm=CLIP, **settings)
    model = _model(layers, dtype)
    booster = Booster(plugin)
    model, opt = booster.boost(model, torch.optim.AdamW(model.parameters(), lr=LR))
    mesh = plugin.mesh
    assert mesh is not None
    coord, dp = plugin.data_rank()
    rows = slice(coord * B // dp, (coord + 1) * B // dp)
    losses = []
    for x, y in batches(steps):
        if plugin.pp_size > 1:
            loss = booster.execute_pipeline(x[rows], y[rows], model, opt)
        else:
            loss = model(x[rows], y[rows])
            booster.backward(loss, opt)
        opt.step()
        opt.zero_grad()
        losses.append(_mean_over_dp(loss, mesh.group("dp"), dp))
    return plugin, booster, model, opt, losses


def _plain(name: str) -> str:
    """A pipeline module's ``chunks.<i>.<name>`` as the plain model's ``<name>``."""
    return name.split(".", 2)[2] if name.startswith("chunks.") else name


def _sharded_like(plugin: HybridParallelPlugin, model: GPT) -> GPT:
    """A copy of ``model`` sharded as the plugin sharded its own (tensor parallelism)."""
    want = copy.deepcopy(model)
    if plugin.tp_size > 1:
        seq = megatron_sequence(plugin.sequence_parallel)
        parallelize(want, plugin.mesh, sequence_parallel=seq)  # type: ignore[arg-type]
    return want


def train_case(
    settings: dict, steps: int, layers: int = 4, dtype: str = "float32", ref_dtype: str = ""
) -> dict:
    """``steps`` Booster steps of the hybrid plugin ``settings`` against the reference (in
    ``ref_dtype``, default ``dtype``: a float64 reference of an fp32 run measures its distance
    from exact arithmetic)."""
    plugin, booster, model, _, losses = _hybrid_run(settings, steps, layers, dtype)
    mesh = plugin.mesh
    assert mesh is not None
    ref_losses, ref = _reference(layers, steps, plugin.microbatches, ref_dtype or dtype)
    want = _sharded_like(plugin, ref)
    got = {_plain(n): p for n, p in model.named_parameters()}
    out = _errors(losses, ref_losses, got, want)
    out["stats"] = booster.memory_stats()
    out["tp_ops"] = sorted({op for a, op in mesh.comm.counter.snapshot() if a == "tp"})
    out["dtypes"] = sorted({str(p.dtype) for p in model.parameters()})
    plugin.close()
    return out


def low_precision_case(settings: dict, steps: int, layers: int = 2) -> dict:
    """A bf16/fp16 run of ``settings`` (ZeRO-1/2) against fp32 AdamW: the worst relative loss
    error and, over this rank's tensors (ZeRO's fp32 masters; with pp, its stages'), the worst
    drift: distance from fp32 training's result over the distance fp32 training moved it."""
    plugin, booster, model, opt, losses = _hybrid_run(settings, steps, layers, "float32")
    ref_losses, ref = _reference(layers, steps, plugin.microbatches)
    want = dict(_sharded_like(plugin, ref).named_parameters())
    start = dict(_sharded_like(plugin, _model(layers)).named_parameters())
    masters = {_plain(n): v for n, v in opt.full_state_dict().items()}
    mesh = plugin.mesh
    assert mesh is not None
    with torch.no_grad():
        drift = {
            n: float((masters[n] - w).norm() / (w - start[n]).norm())
            for n, w in want.items()
            if n in masters
        }
    worst = max(drift, key=drift.__getitem__)
    out = {
        "loss_err": max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses, strict=True)),
        "drift": drift[worst],
        "worst": worst,
        "dtypes": sorted({str(p.dtype) for p in model.parameters()}),
        "mesh": booster.memory_stats()["mesh"],
        "skipped": getattr(opt, "skipped_last", False),
        "tp_ops": sorted({op for a, op in mesh.comm.counter.snapshot() if a == "tp"}),
    }
    plugin.close()
    return out


def gemini_case(
    settings: dict, steps: int, root: str, layers: int = 2, dtype: str = "float32"
) -> dict:
    """``GeminiPlugin(**settings)`` (tensor parallel) for ``steps`` steps against the reference,
    saving a checkpoint half way; then a fresh plugin of the same layout loads it and redoes
    the second half (``resume_err``: its losses against the uninterrupted run's), and the
    consolidated export (safetensors shards and their index) is checked against the reference
    at that step. ``dtype="float64"`` with ``precision="fp64"``: all of it in float64."""
    half = steps // 2
    plugin = GeminiPlugin(max_grad_norm=CLIP, **settings)
    booster, model, opt = _gemini_boost(plugin, layers, dtype)
    mesh = plugin.mesh
    assert mesh is not None
    losses = _gemini_steps(booster, model, opt, mesh, batches(steps)[:half])
    saved = booster.save(model, opt, Path(root), step=half)
    losses += _gemini_steps(booster, model, opt, mesh, batches(steps)[half:])
    stats = booster.memory_stats()
    ref_losses, ref = _reference(layers, steps, 1, dtype)
    want = copy.deepcopy(ref)
    if plugin.tp_size > 1:
        parallelize(want, mesh)
    full = model.full_state_dict()
    out = _errors(losses, ref_losses, full, want)
    out["dtypes"] = sorted({str(v.dtype) for v in full.values()})
    out["stats"] = stats
    plugin.close()

    again = GeminiPlugin(max_grad_norm=CLIP, **settings)
    booster, model, opt = _gemini_boost(again, layers, dtype)
    assert again.mesh is not None
    booster.load(model, opt, Path(root))
    resumed = _gemini_steps(booster, model, opt, again.mesh, batches(steps)[half:])
    out["resume_err"] = max(abs(a - b) / abs(b) for a, b in zip(resumed, losses[half:]))
    again.close()
    if saved is not None:  # rank 0: the consolidated export equals the reference at ``half``
        full = load_sharded_safetensors(saved)
        _, ref_half = _reference(layers, half, 1, dtype)
        out["export_err"] = max(_rel(full[n], p.detach()) for n, p in ref_half.named_parameters())
        out["export_names"] = sorted(full) == sorted(ref_half.state_dict())
        out["folders"] = sorted(p.name for p in saved.iterdir() if p.is_dir())
        out["layout_index"] = (saved / "layout_index.json").is_file()
    return out


def gemini_lazy_case(settings: dict, steps: int) -> dict:
    """Losses of ``GeminiPlugin(**settings)`` on a model built in ``lazy_init()`` and on the same
    model built eagerly (bit-identical when lazy init replays construction exactly)."""
    out = {}
    for name in ("lazy", "eager"):
        lazy = None
        if name == "lazy":
            with lazy_init() as lazy:
                model = _model(2)
        else:
            model = _model(2)
        plugin = GeminiPlugin(max_grad_norm=CLIP, lazy=lazy, **settings)
        booster = Booster(plugin)
        model, opt = booster.boost(model, torch.optim.AdamW(model.parameters(), lr=LR))
        assert plugin.mesh is not None
        out[name] = _gemini_steps(booster, model, opt, plugin.mesh, batches(steps))
        plugin.close()
    return out


def _gemini_boost(plugin: GeminiPlugin, layers: int, dtype: str = "float32") -> tuple:
    model = _model(layers, dtype)
    booster = Booster(plugin)
    model, opt = booster.boost(model, torch.optim.AdamW(model.parameters(), lr=LR))
    return booster, model, opt


def _gemini_steps(booster, model, opt, mesh, batches) -> list[float]:  # type: ignore[no-untyped-def]
    coord, dp = mesh.coord("dp"), mesh.size("dp")
    rows = slice(coord * B // dp, (coord + 1) * B // dp)
    losses = []
    for x, y in batches:
        loss = model(x[rows], y[rows])
        booster.backward(loss, opt)
        opt.step()
        opt.zero_grad()
        losses.append(_mean_over_dp(loss, mesh.group("dp"), dp))
    return losses


def bad_settings() -> dict[str, str]:
    """Each bad setting raises a one-line ConfigError before any process group exists."""
    out: dict[str, str] = {}
    world = dist.get_world_size()
    cases = {
        "not dividing": (HybridParallelPlugin, {"tp_size": 3}),
        "non-square 2d": (HybridParallelPlugin, {"tp_size": 2, "tp_mode": "2d"}),
        "zero 3": (HybridParallelPlugin, {"zero_stage": 3}),
        "stages > layers": (HybridParallelPlugin, {"pp_size": world}),
        "gemini not dividing": (GeminiPlugin, {"tp_size": 3}),
        "gemini non-cube 3d": (GeminiPlugin, {"tp_size": 4, "tp_mode": "3d"}),
        "gemini tp mode": (GeminiPlugin, {"tp_size": 2, "tp_mode": "4d"}),
        "gemini model": (GeminiPlugin, {"tp_size": 2}),
        "zero amsgrad": (HybridParallelPlugin, {"tp_size": 2, "zero_stage": 1}),
    }
    for name, (cls, kw) in cases.items():
        try:
            plugin = cls(**kw)
            model = _model(2) if name != "gemini model" else torch.nn.Linear(4, 4)
            amsgrad = name == "zero amsgrad"
            Booster(plugin).boost(model, torch.optim.AdamW(model.parameters(), amsgrad=amsgrad))
            out[name] = "no error"
            plugin.close()
        except ConfigError as e:
            out[name] = str(e)
    return out
