"""What the hybrid plugin needs of its gradients beyond ZeRO: each parameter's layout over tp and
pp (for the mesh-wide norm), and, without ZeRO, the sum over sp, the mean over dp and the clip
([Note: hybrid gradients] in ``_hybrid.py``)."""

from __future__ import annotations

from torch import nn

from colossal_contracts import ParamSharding, ShardAxis
from colossal_parallel import ProcessMesh, all_reduce_grads
from colossal_zero import mesh_grad_norm

__all__ = ["mesh_layout", "reduce_and_clip"]


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
    whole mesh (``layout``: each parameter's split) when ``max_grad_norm`` > 0."""
    params = [p for _, p in named]
    if sp > 1:
        all_reduce_grads(params, mesh.comm, "sp", average=False)
    if mesh.size("dp") > 1:
        all_reduce_grads(params, mesh.comm, "dp", average=True)
    if max_grad_norm > 0:
        layout = layout or {}
        parts = [(p.grad, layout.get(n)) for n, p in named if p.grad is not None]
        norm = mesh_grad_norm(parts, shardings=layout).norm
        coef = max_grad_norm / (norm + 1e-6)
        if coef < 1.0:
            for p in params:
                if p.grad is not None:
                    p.grad.mul_(coef)
