"""The Gemini optimizer: Adam/AdamW on the fp32 shards of a ``GeminiModule``'s chunks.

[Note: shard update] For every parameter this rank holds a slice of (in its shard), the update
reads the slice's reduced gradient (from the "acc" chunk after accumulation, else the working
buffer: the low-precision parameter chunk with masters, the fp32 "grad" chunk without), updates
the fp32 slice (master, or the parameter itself in fp32) with the exp_avg / exp_avg_sq chunks on
the device where they live (``adamw_update``), then refreshes the low-precision parameters from
the masters. Gradient clipping and fp16 overflow checks use the norm over all shards of all ranks,
and over the tensor-parallel axes that ``sharding`` names ([Note: mesh-wide norms]).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

from colossal_contracts import ConfigError, ParamSharding

from ._adam import AdamHyper, adamw_update
from ._mesh_norm import mesh_grad_norm
from ._module import GeminiModule
from ._scaler import DynamicLossScaler

__all__ = ["GeminiOptimizer"]

STATE_KINDS = ("exp_avg", "exp_avg_sq")


class GeminiOptimizer(torch.optim.Optimizer):
    """Adam/AdamW for a ``GeminiModule``; see [Note: shard update].

    ``params`` are the module's parameters or param groups (as for ``torch.optim.AdamW``);
    ``max_grad_norm > 0`` clips the global gradient norm. With fp16, ``backward(loss)`` scales the
    loss and ``step`` skips steps whose gradients overflow (see [Note: loss scaling]).
    ``sharding`` (parameter name -> ``ParamSharding``) says which parameters are split along or
    replicated over other mesh axes, so norm and overflow agree over the whole mesh.
    """

    def __init__(
        self,
        model: GeminiModule,
        params: Iterable[torch.Tensor] | Iterable[dict] | None = None,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
        *,
        max_grad_norm: float = 0.0,
        adamw: bool = True,
        sharding: Mapping[str, ParamSharding] | None = None,
    ):
        if not isinstance(model, GeminiModule):
            raise ConfigError("GeminiOptimizer needs the GeminiModule that apply_gemini returned")
        if max_grad_norm < 0:
            raise ConfigError(f"max_grad_norm must be >= 0 (0: no clipping), got {max_grad_norm}")
        AdamHyper(lr, betas, eps, weight_decay, adamw)
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}
        super().__init__(list(params) if params is not None else model.parameters(), defaults)
        self.model, self.rt = model, model.runtime
        self.adamw, self.max_grad_norm = adamw, max_grad_norm
        self.sharding: dict[str, ParamSharding] = dict(sharding or {})
        self.group_of: dict[str, int] = {}
        for gi, group in enumerate(self.param_groups):
            for p in group["params"]:
                name = self.rt.names.get(id(p))
                if name is None:
                    raise ConfigError(
                        f"a parameter of shape {tuple(p.shape)} given to GeminiOptimizer is not "
                        "managed by this GeminiModule; pass model.parameters() or groups of them"
                    )
                self.group_of[name] = gi
        for kind in STATE_KINDS:
            self.rt.manager.add_parallel(kind, torch.float32)
        self.steps: dict[str, torch.Tensor] = {}  # name -> float32 scalar step count
        prec = self.rt.precision
        self.scaler = DynamicLossScaler(self.rt.config.loss_scaler) if prec.loss_scaling else None
        self.last_grad_norm: float = 0.0
        self.skipped_last: bool = False

    @classmethod
    def from_torch(
        cls,
        model: GeminiModule,
        optimizer: torch.optim.Optimizer,
        *,
        max_grad_norm: float = 0.0,
        sharding: Mapping[str, ParamSharding] | None = None,
    ) -> GeminiOptimizer:
        """The Gemini equivalent of a ``torch.optim.Adam``/``AdamW`` built on ``model``'s params."""
        if not isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW):
            raise ConfigError(
                f"Gemini trains with Adam or AdamW, got {type(optimizer).__name__}; build the "
                "optimizer as torch.optim.AdamW(...)"
            )
        d = optimizer.defaults
        if d.get("amsgrad") or d.get("maximize"):
            raise ConfigError("Gemini's Adam supports neither amsgrad nor maximize; turn them off")
        groups = [
            {k: v for k, v in g.items() if k in ("params", "lr", "betas", "eps", "weight_decay")}
            for g in optimizer.param_groups
        ]
        return cls(
            model,
            groups,
            lr=d["lr"],
            betas=d["betas"],
            eps=d["eps"],
            weight_decay=d["weight_decay"],
            max_grad_norm=max_grad_norm,
            adamw=isinstance(optimizer, torch.optim.AdamW),
            sharding=sharding,
        )

    @property
    def loss_scale(self) -> float:
        return self.scaler.scale if self.scaler is not None else 1.0

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``, scaled by the loss scale under fp16."""
        (loss * self.loss_scale if self.scaler is not None else loss).backward()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget collected gradients (restoring parameters whose storage held them)."""
        self.rt.clear_grads()

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        loss = closure() if closure is not None else None
        rt, m = self.rt, self.rt.manager
        lists: dict[int, tuple[list, list, list, list, list]] = {}
        write_back: list[tuple[torch.Tensor, torch.Tensor]] = []
        norm_parts: list[tuple[torch.Tensor, ParamSharding | None]] = []
        updated = []
        elsewhere: list[torch.Tensor] = []  # step counts of tensors other ranks hold
        for c in m.param_chunks():
            names = [n for n in c.records if n in rt.got_grad and n in self.group_of]
            if not names:
                continue
            grads = rt.gradients(c)
            fp32 = rt.roles.fp32(c)
            avg, sq = (m.parallel_chunk(k, c) for k in STATE_KINDS)
            dev = avg.shard.device  # type: ignore[union-attr]
            updated.append(c)
            for n in names:
                # every rank counts every tensor's steps: after a re-pack in first-use order
                # ([Note: first-use order]) a rank may come to hold a slice it did not hold
                step = self.steps.setdefault(n, torch.zeros((), dtype=torch.float32))
                part = fp32.shard_view(n)
                if part is None:
                    elsewhere.append(step)
                    continue
                pv = part[0]
                if pv.device != dev:  # update where the optimizer states live, then copy back
                    home, pv = pv, pv.to(dev)
                    write_back.append((home, pv))
                gv = grads.shard_view(n)[0]  # type: ignore[index]
                if gv.device != dev or gv.dtype != torch.float32:
                    gv = gv.to(dev, torch.float32)
                row = lists.setdefault(self.group_of[n], ([], [], [], [], []))
                for lst, t in zip(
                    row, (pv, gv, avg.shard_view(n)[0], sq.shard_view(n)[0], step), strict=True
                ):  # type: ignore[index]
                    lst.append(t)
                norm_parts.append((gv, self.sharding.get(n)))
        found = mesh_grad_norm(norm_parts, group=rt.group, shardings=self.sharding)
        scale = self.loss_scale
        self.last_grad_norm = found.norm / scale
        self.skipped_last = self.scaler is not None and found.overflow
        if self.skipped_last:
            self.scaler.update(True)  # type: ignore[union-attr]
            rt.clear_grads()
            return loss
        grad_scale = scale
        if self.max_grad_norm > 0:
            coef = self.max_grad_norm / (self.last_grad_norm + 1e-6)
            if coef < 1.0:
                grad_scale = scale / coef
        for s in elsewhere:
            s += 1
        for gi, (ps, gs, avgs, sqs, steps) in lists.items():
            for s in steps:
                s += 1
            hyper = AdamHyper.from_group(self.param_groups[gi], adamw=self.adamw)
            adamw_update(ps, gs, avgs, sqs, steps, hyper, grad_scale=grad_scale)
        for dst, src in write_back:
            dst.copy_(src)
        for c in updated:
            rt.stepped(c)
        rt.clear_grads()
        if self.scaler is not None:
            self.scaler.update(False)
        return loss
