"""The Adam/AdamW update on flat fp32 shards, run where each shard lives.

[Note: hybrid update] Tensors are grouped by device and each group is updated by one fused
kernel call: ``torch._fused_adamw_`` (a vectorised CPU kernel on the host, the multi-tensor CUDA
kernel on an accelerator). Gradients may be scaled (fp16 loss scaling, clipping): the kernel
divides them by ``grad_scale`` and, with ``found_inf`` set, skips the update. Devices without a
fused kernel fall back to torch's ``foreach`` implementation with the same arithmetic. The
kernels take the scale as a float32 tensor: float64 tensors (precision fp64, [Note: fp64
precision]) have their gradients divided in float64 first, so no fp32 rounding enters.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from colossal_contracts import ConfigError

__all__ = ["STATE_KINDS", "AdamHyper", "HybridAdam", "adamw_update", "global_grad_norm"]

_FUSED_DEVICES = ("cpu", "cuda")
STATE_KINDS = ("exp_avg", "exp_avg_sq")  # Adam's states of a tensor, by the names torch gives them


@dataclass(frozen=True)
class AdamHyper:
    """Hyper-parameters of one Adam/AdamW parameter group.

    Attributes:
        lr: learning rate.
        betas: coefficients of the running averages of the gradient and its square.
        eps: added to the denominator.
        weight_decay: decoupled (AdamW) decay, or L2 added to the gradient when ``adamw`` is False.
        adamw: decoupled weight decay (AdamW) rather than L2 (Adam).
    """

    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    adamw: bool = True

    def __post_init__(self) -> None:
        if not self.lr >= 0:
            raise ConfigError(f"lr must be >= 0, got {self.lr}")
        if not all(0.0 <= b < 1.0 for b in self.betas):
            raise ConfigError(f"betas must be within [0, 1), got {self.betas}")
        if not self.eps >= 0 or not self.weight_decay >= 0:
            raise ConfigError("eps and weight_decay must be >= 0")

    @classmethod
    def from_group(cls, group: dict, *, adamw: bool = True) -> AdamHyper:
        """The hyper-parameters of a torch optimizer's param group."""
        return cls(
            lr=float(group["lr"]),
            betas=tuple(group.get("betas", (0.9, 0.999))),
            eps=float(group.get("eps", 1e-8)),
            weight_decay=float(group.get("weight_decay", 0.0)),
            adamw=adamw,
        )


def adamw_update(
    params: Sequence[torch.Tensor],
    grads: Sequence[torch.Tensor],
    exp_avgs: Sequence[torch.Tensor],
    exp_avg_sqs: Sequence[torch.Tensor],
    steps: Sequence[torch.Tensor],
    hyper: AdamHyper,
    *,
    grad_scale: float = 1.0,
) -> None:
    """One Adam(W) update of fp32 (or float64) ``params`` in place; see [Note: hybrid update].

    ``steps`` are float32 scalar tensors already incremented for this step (they may be shared).
    Gradients are divided by ``grad_scale`` first (and may be overwritten by the division).
    Every list has one entry per tensor; tensors of one index share a device.
    """
    by_dev: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for i, p in enumerate(params):
        by_dev.setdefault((p.device, p.dtype), []).append(i)
    for (dev, _), idx in by_dev.items():
        ps = [params[i] for i in idx]
        gs = [grads[i] for i in idx]
        ms = [exp_avgs[i] for i in idx]
        vs = [exp_avg_sqs[i] for i in idx]
        ss = [_on(steps[i], dev) for i in idx]
        divisor = grad_scale
        if divisor != 1.0 and gs[0].dtype == torch.float64:  # the kernel's scale is fp32
            torch._foreach_div_(gs, divisor)
            divisor = 1.0
        scale = None if divisor == 1.0 else torch.tensor(divisor, device=dev)
        if dev.type in _FUSED_DEVICES:
            kernel = torch._fused_adamw_ if hyper.adamw else torch._fused_adam_
            kernel(
                ps, gs, ms, vs, [], ss,
                lr=hyper.lr, beta1=hyper.betas[0], beta2=hyper.betas[1],
                weight_decay=hyper.weight_decay, eps=hyper.eps,
                amsgrad=False, maximize=False, grad_scale=scale, found_inf=None,
            )  # fmt: skip
        else:  # pragma: no cover - devices without a fused kernel
            _foreach_update(ps, gs, ms, vs, ss, hyper, divisor)


def _on(step: torch.Tensor, dev: torch.device) -> torch.Tensor:
    return step if step.device == dev else step.to(dev)


def _foreach_update(
    ps: list[torch.Tensor],
    gs: list[torch.Tensor] | tuple[torch.Tensor, ...],
    ms: list[torch.Tensor],
    vs: list[torch.Tensor],
    ss: list[torch.Tensor],
    hyper: AdamHyper,
    grad_scale: float,
) -> None:
    b1, b2 = hyper.betas
    if grad_scale != 1.0:
        torch._foreach_div_(gs, grad_scale)
    if hyper.weight_decay:
        if hyper.adamw:
            torch._foreach_mul_(ps, 1 - hyper.lr * hyper.weight_decay)
        else:
            gs = torch._foreach_add(gs, ps, alpha=hyper.weight_decay)
    torch._foreach_lerp_(ms, gs, 1 - b1)
    torch._foreach_mul_(vs, b2)
    torch._foreach_addcmul_(vs, gs, gs, 1 - b2)
    for p, m, v, s in zip(ps, ms, vs, ss, strict=True):
        t = float(s)
        step_size = hyper.lr / (1 - b1**t)
        denom = (v / (1 - b2**t)).sqrt_().add_(hyper.eps)
        p.addcdiv_(m, denom, value=-step_size)


def global_grad_norm(
    grads: Iterable[torch.Tensor], *, group: torch.distributed.ProcessGroup | None = None
) -> float:
    """The 2-norm of all ``grads`` together, summed over the ranks of ``group`` (whose shards are
    disjoint; None: this process only). ``inf``/``nan`` when any gradient on any rank holds one,
    so every rank agrees on an overflow. Collective over ``group``."""
    total = torch.zeros((), dtype=torch.float64)
    for g in grads:
        total += torch.linalg.vector_norm(g, 2, dtype=torch.float32).double().square().cpu()
    if group is not None and torch.distributed.get_world_size(group) > 1:
        if torch.distributed.get_backend(group) == "nccl":  # NCCL reduces CUDA tensors only
            total = total.cuda()
        torch.distributed.all_reduce(total, group=group)
        total = total.cpu()
    return math.sqrt(float(total)) if math.isfinite(float(total)) else float(total)


class HybridAdam(torch.optim.Optimizer):
    """Adam/AdamW over ordinary fp32 tensors wherever they live, one fused kernel per device.

    A drop-in for ``torch.optim.AdamW`` (``adamw=True``) or ``Adam`` on parameters spread over the
    host and an accelerator: each device's tensors are updated by that device's kernel. Gemini
    uses the same update (``adamw_update``) on chunk shards.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
        *,
        adamw: bool = True,
    ):
        AdamHyper(lr, betas, eps, weight_decay, adamw)  # validates
        super().__init__(
            params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}
        )
        self.adamw = adamw

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            ps, gs, ms, vs, ss = [], [], [], [], []
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.dtype != torch.float32 and p.dtype != torch.float64:
                    raise ConfigError(
                        f"HybridAdam updates fp32 or float64 tensors, got {p.dtype}; keep fp32 "
                        "master weights (colossal_zero.apply_gemini does) or cast the parameters"
                    )
                st = self.state[p]
                if not st:
                    st["step"] = torch.zeros((), dtype=torch.float32)
                    st["exp_avg"] = torch.zeros_like(p)
                    st["exp_avg_sq"] = torch.zeros_like(p)
                st["step"] += 1
                ps.append(p)
                gs.append(p.grad)
                ms.append(st["exp_avg"])
                vs.append(st["exp_avg_sq"])
                ss.append(st["step"])
            if ps:
                adamw_update(ps, gs, ms, vs, ss, AdamHyper.from_group(group, adamw=self.adamw))
        return loss
