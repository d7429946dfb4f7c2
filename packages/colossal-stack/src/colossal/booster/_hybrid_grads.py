"""What the hybrid plugin needs of its gradients and optimizer: each parameter's layout over tp
and pp (for the mesh-wide norm), the user's optimizer rebuilt on this rank's shards (converted to
ZeRO-1/2, or, without ZeRO, the same class with the sum over sp, the mean over dp and the clip
before each step: [Note: hybrid gradients] in ``_hybrid.py``)."""

from __future__ import annotations

import torch
from torch import nn

from colossal_contracts import ParamSharding, ShardAxis
from colossal_parallel import ProcessMesh, all_reduce_grads
from colossal_zero import LowLevelZeroOptimizer, ZeroConfig, mesh_grad_norm

from ._groups import GroupMap, rebuilt

__all__ = ["mesh_layout", "rank_optimizer", "reduce_and_clip"]


def mesh_layout(
    model: nn.Module,
    names: dict[str, str],
    tp_layout: dict[str, ParamSharding] | None,
    tied: set[int],
    mesh: ProcessMesh,
    pp_size: int,
) -> dict[str, ParamSharding] | None:
    """Name in ``model`` -> layout over tp and pp: a stage's parameters are split over pp, the
    tied embedding (ids in ``tied``) replicated on the first and last stage; None when nothing
    is split."""
    if tp_layout is None and pp_size == 1:
        return None
    pp = ShardAxis("pp", mesh.group("pp"), pp_size, mesh.coord("pp"))
    out = {}
    for n, p in model.named_parameters():
        rec = tp_layout[names[n]] if tp_layout is not None else ParamSharding()
        if pp_size > 1:
            if id(p) in tied:
                rec = ParamSharding(rec.split, (*rec.replicated, pp))
            else:
                rec = ParamSharding((*rec.split, pp), rec.replicated)
        out[n] = rec
    return out


def reduce_and_clip(
    named: list[tuple[str, nn.Parameter]],
    mesh: ProcessMesh,
    *,
    sp: int,
    max_grad_norm: float,
    layout: dict[str, ParamSharding] | None,
) -> None:
    """Sum the gradients over sp, average them over dp, and clip them by the norm over the
    whole mesh (``layout``: each parameter's split) when ``max_grad_norm`` > 0.

    The norm and the clip factor are colossal-zero's (``mesh_grad_norm``, ``GradNorm.clip_coef``:
    the arithmetic Gemini's and ZeRO-1/2's optimizers clip with). What is the hybrid plugin's
    own is the reduction over sp and dp before it, and multiplying the gradients in place (the
    user's optimizer steps on them; ZeRO's divide inside their update). There is no skip: without
    ZeRO the precision is fp32 or fp64 (the capability table), so there is no loss scaler."""
    params = [p for _, p in named]
    if sp > 1:
        all_reduce_grads(params, mesh.comm, "sp", average=False)
    if mesh.size("dp") > 1:
        all_reduce_grads(params, mesh.comm, "dp", average=True)
    if max_grad_norm > 0:
        layout = layout or {}
        parts = [(p.grad, layout.get(n)) for n, p in named if p.grad is not None]
        coef = mesh_grad_norm(parts, shardings=layout).clip_coef(max_grad_norm)
        if coef < 1.0:
            for p in params:
                if p.grad is not None:
                    p.grad.mul_(coef)


def rank_optimizer(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    group_map: GroupMap,
    user_names: dict[str, str],
    mesh: ProcessMesh,
    *,
    zero: ZeroConfig | None,
    sp: int,
    max_grad_norm: float,
    sharding: dict[str, ParamSharding] | None,
) -> tuple[torch.optim.Optimizer, list[nn.Parameter]]:
    """The user's ``optimizer`` (same class and settings) on ``model``'s parameters on this rank,
    each in the group of its unsharded original (``user_names``: name in ``model`` -> the user's
    name); with ``zero`` converted as any Adam is (amsgrad/maximize refused), else with the
    reduction and clip as a step pre-hook. Also the parameters in group order."""
    named_out = [(user_names[n], p) for n, p in model.named_parameters()]
    groups = group_map.groups(named_out, keep=("lr", "betas", "eps", "weight_decay"))
    params = [p for g in groups for p in g["params"]]
    if zero is not None:
        nonempty = rebuilt(optimizer, [g for g in groups if g["params"]])
        opt: torch.optim.Optimizer = LowLevelZeroOptimizer.from_torch(
            model,
            nonempty,
            config=zero,
            group=mesh.group("dp_sp" if sp > 1 else "dp"),  # [Note: hybrid gradients]
            max_grad_norm=max_grad_norm,
            sharding=sharding,
        )
        return opt, params
    opt = rebuilt(optimizer, groups)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    opt.register_step_pre_hook(
        lambda *_: reduce_and_clip(named, mesh, sp=sp, max_grad_norm=max_grad_norm, layout=sharding)
    )
    return opt, params
