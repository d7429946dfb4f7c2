"""ZeRO stages 1 and 2: Adam(W) whose fp32 masters and moments (and, for stage 2, gradients) are
sharded over data-parallel ranks while every rank keeps the whole model in compute precision.

[Note: zero step] Backward leaves each bucket's averaged gradient shard on this rank (stage 1
reduce-scatters the whole gradient buffer at ``step``; stage 2 already did, bucket by bucket,
as backward produced them, see [Note: zero overlap]). ``step`` then takes the global norm and
overflow flag over the whole mesh (``mesh_grad_norm``), skips the step on overflow (fp16),
clips, updates the fp32 shard with the hybrid Adam where the states live (host when offloaded),
writes it into this rank's slice of the parameters and all-gathers every bucket in place.

[Note: zero overlap] In stage 2 a parameter's post-accumulate-grad hook adds its gradient into
its bucket's gathered buffer and drops ``.grad``. When every parameter of a bucket has arrived,
the bucket starts an async reduce-scatter (buckets start in bucket order on every rank, so the
collectives match); backward goes on computing while it runs. At the end of backward, buckets
with parameters that got no gradient are reduced with zeros for them, and every reduce is waited
for. Micro-batches after the first accumulate into the shard.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from colossal_chunk import PendingReduce
from colossal_contracts import (
    CapacityError,
    ConfigError,
    InternalError,
    ParamSharding,
    TensorState,
)

from ..optim._adam import AdamHyper, adamw_update
from ..optim._clip import ClippedAdam
from ..optim._from_torch import adam_arguments
from ..optim._mesh_norm import mesh_grad_norm
from ._buckets import Bucket, build_buckets
from ._config import ZeroConfig

__all__ = ["LowLevelZeroOptimizer"]

_S = TensorState


class LowLevelZeroOptimizer(ClippedAdam):
    """Adam/AdamW under ZeRO stage 1 or 2 over the data-parallel ``group``; see [Note: zero step].

    Built on ``model`` (fp32, the same on every rank) and its parameters or param groups as for
    ``torch.optim.AdamW``; parameters not given stay frozen. Construction makes the parameters
    views into flat compute-precision buckets. Use ``backward(loss)`` (scales fp16 losses),
    ``step()``, ``zero_grad()``. ``sharding`` maps parameter names to their tensor-parallel layout
    so norms and overflow agree over the whole mesh.
    """

    def __init__(
        self,
        model: nn.Module,
        params: Iterable[torch.Tensor] | Iterable[dict] | None = None,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
        *,
        config: ZeroConfig | None = None,
        group: dist.ProcessGroup | None = None,
        max_grad_norm: float = 0.0,
        adamw: bool = True,
        sharding: Mapping[str, ParamSharding] | None = None,
    ):
        self.config = config = config or ZeroConfig()
        self.precision = prec = config.precision_spec
        super().__init__(
            list(params) if params is not None else model.parameters(),
            lr,
            betas,
            eps,
            weight_decay,
            adamw=adamw,
            max_grad_norm=max_grad_norm,
            loss_scaler=config.loss_scaler if prec.loss_scaling else None,
        )
        if group is None and dist.is_available() and dist.is_initialized():
            group = dist.group.WORLD
        self.group, self.model = group, model
        self.world = dist.get_world_size(group) if group is not None else 1
        self.sharding: dict[str, ParamSharding] = dict(sharding or {})
        names = {id(p): n for n, p in model.named_parameters()}
        self.canonical_names = names  # id(param) -> its first name (tied parameters share one)
        self.group_of: dict[str, int] = {}
        named: list[tuple[str, nn.Parameter]] = []
        for gi, grp in enumerate(self.param_groups):
            for p in grp["params"]:
                name = names.get(id(p))
                if name is None or not p.requires_grad:
                    raise ConfigError(
                        f"a parameter of shape {tuple(p.shape)} given to LowLevelZeroOptimizer is "
                        "not a trainable parameter of the model; pass model.parameters() (or "
                        "groups of them) with requires_grad=True"
                    )
                if p.dtype != torch.float32 and p.dtype != prec.state_dtype:
                    raise ConfigError(
                        f"parameter {name!r} is {p.dtype}; build the model in fp32 and choose "
                        "the compute precision with ZeroConfig(precision=...)"
                    )
                self.group_of[name] = gi
                named.append((name, p))
        device = named[0][1].device if named else torch.device("cpu")
        prec.check_device(device)
        self.state_device = torch.device("cpu") if config.offload_optimizer else device
        self._check_host_room(sum(p.numel() for _, p in named))
        self.buckets: list[Bucket] = build_buckets(
            named,
            dtype=prec.param_dtype,
            master=prec.master or (config.offload_optimizer and device != self.state_device),
            state_device=self.state_device,
            stage=config.stage,
            bucket_numel=config.bucket_numel,
            group=group,
            state_dtype=prec.state_dtype,
        )
        with torch.no_grad():  # frozen parameters compute in the same precision
            for p in model.parameters():
                if id(p) not in {id(q) for _, q in named} and p.is_floating_point():
                    p.data = p.data.to(prec.param_dtype)
        self.steps: dict[str, torch.Tensor] = {}  # name -> float32 scalar step count
        self.got_grad: set[str] = set()
        self.last_grad_norm: float = 0.0
        self.comm_bytes: dict[str, int] = {"reduce_scatter": 0, "all_gather": 0}
        self._micro = 0  # backward passes since the last step
        self._pending: list[PendingReduce] = []
        self._next_launch = 0  # stage 2: first bucket not yet reducing in this backward
        self._in_backward = False
        self._bucket_of: dict[str, Bucket] = {n: b for b in self.buckets for n in b.params}
        self._hooks = [
            p.register_post_accumulate_grad_hook(self._make_hook(name)) for name, p in named
        ]

    # ----- setup --------------------------------------------------------------------------------
    @classmethod
    def from_torch(
        cls,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        config: ZeroConfig | None = None,
        group: dist.ProcessGroup | None = None,
        max_grad_norm: float = 0.0,
        sharding: Mapping[str, ParamSharding] | None = None,
    ) -> LowLevelZeroOptimizer:
        """The ZeRO-1/2 equivalent of a ``torch.optim.Adam``/``AdamW`` built on ``model``'s
        fp32 parameters (the same groups)."""
        groups, kwargs = adam_arguments(optimizer, who="ZeRO")
        return cls(
            model,
            groups,
            config=config,
            group=group,
            max_grad_norm=max_grad_norm,
            sharding=sharding,
            **kwargs,
        )

    def _check_host_room(self, numel: int) -> None:
        if not self.config.offload_optimizer:
            return
        # master, exp_avg, exp_avg_sq, gradient copy: fp32 (float64 under fp64)
        need = -(-numel // self.world) * 4 * self.precision.state_dtype.itemsize
        room = self.config.host_bytes
        if room is None:
            room = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        if need > room:
            raise CapacityError(
                f"offloading the optimizer needs {need / 2**20:.1f} MiB of host memory per rank "
                f"but {room / 2**20:.1f} MiB is available; add data-parallel ranks, free host "
                "memory, or set offload_optimizer=False"
            )

    def _make_hook(self, name: str) -> Any:
        def hook(p: torch.Tensor) -> None:
            self.got_grad.add(name)
            if self.config.stage == 2:
                self._grad_ready(name, p)

        return hook

    # ----- backward -----------------------------------------------------------------------------
    def _grad_ready(self, name: str, p: torch.Tensor) -> None:
        """Stage 2: see [Note: zero overlap]."""
        if not self._in_backward:
            self._in_backward = True
            torch.autograd.Variable._execution_engine.queue_callback(self._end_backward)
        b = self._bucket_of[name]
        self._open(b)
        grad = p.grad
        if grad is None:  # a post-accumulate-grad hook runs once a gradient was accumulated
            raise InternalError(f"ZeRO: the gradient hook of {name!r} ran without a gradient")
        with torch.no_grad():
            b.grad.view(name).add_(grad)
        p.grad = None
        b.grad.set_state(name, _S.COMPUTE)
        b.grad.set_state(name, _S.READY_FOR_REDUCE)
        b.num_ready += 1
        self._launch(complete_only=True)

    def _open(self, b: Bucket) -> None:
        if b.open:
            return
        b.open = True
        if self.world == 1:
            if self._micro == 0:
                b.grad.materialize(b.grad.payload)  # zero the shard
            return
        cap = b.grad.capacity
        b.grad.materialize(torch.empty(cap, dtype=b.grad.dtype, device=b.flat.device))

    def _launch(self, *, complete_only: bool) -> None:
        while self._next_launch < len(self.buckets):
            b = self.buckets[self._next_launch]
            if b.num_ready < len(b.params):
                if complete_only:
                    return
                self._open(b)
                for name in b.params:
                    if b.grad.state(name) is not _S.READY_FOR_REDUCE:
                        b.grad.set_state(name, _S.COMPUTE)
                        b.grad.set_state(name, _S.READY_FOR_REDUCE)
            self._pending.append(b.grad.start_reduce_scatter(accumulate=self._micro > 0))
            self.comm_bytes["reduce_scatter"] += b.grad.full_bytes if self.world > 1 else 0
            self._next_launch += 1

    def _end_backward(self) -> None:
        self._launch(complete_only=False)
        self._wait()
        for b in self.buckets:
            b.num_ready, b.open = 0, False
        self._next_launch, self._in_backward = 0, False
        self._micro += 1

    def _wait(self) -> None:
        for pending in self._pending:
            pending.wait()
        self._pending.clear()

    def _reduce_stage1(self) -> None:
        for b in self.buckets:
            for name in b.params:
                b.grad.set_state(name, _S.COMPUTE)
                b.grad.set_state(name, _S.READY_FOR_REDUCE)
            self._pending.append(b.grad.start_reduce_scatter())
            self.comm_bytes["reduce_scatter"] += b.grad.full_bytes if self.world > 1 else 0
        self._wait()

    # ----- step ---------------------------------------------------------------------------------
    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget collected gradients (stage 1 zeroes the buffer behind every ``.grad``)."""
        if self.config.stage == 1:
            for b in self.buckets:
                flat = b.grad_flat  # every stage-1 bucket has one
                if flat is None:
                    continue
                if b.grad.is_gathered:
                    flat.zero_()
                else:
                    b.grad.materialize(flat)
        self.got_grad.clear()
        self._micro = 0

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = closure() if closure is not None else None
        if not self.got_grad:
            return loss  # no gradient since the last step
        if self.config.stage == 1:
            self._reduce_stage1()
        lists: dict[int, tuple[list, list, list, list, list]] = {}
        norm_parts: list[tuple[torch.Tensor, ParamSharding | None]] = []
        dev = self.state_device
        for b in self.buckets:
            for name in b.params:
                part = b.grad.shard_view(name)
                if part is None or name not in self.got_grad:
                    continue
                g = part[0]
                norm_parts.append((g, self.sharding.get(name)))
                step = self.steps.setdefault(name, torch.zeros((), dtype=torch.float32))
                row = lists.setdefault(self.group_of[name], ([], [], [], [], []))
                sd = self.precision.state_dtype
                gv = g if g.device == dev and g.dtype == sd else g.to(dev, sd)
                views = (
                    b.fp32.shard_view(name),
                    b.exp_avg.shard_view(name),
                    b.exp_avg_sq.shard_view(name),
                )
                for lst, t in zip(
                    row, (views[0][0], gv, views[1][0], views[2][0], step), strict=True
                ):
                    lst.append(t)
        found = mesh_grad_norm(norm_parts, group=self.group, shardings=self.sharding)
        scale = self.loss_scale
        self.last_grad_norm = found.norm / scale
        if self._skip(found.overflow):
            self.zero_grad()
            return loss
        grad_scale = self._divisor(lambda: self.last_grad_norm)
        for gi, (ps, gs, avgs, sqs, steps) in lists.items():
            for s in steps:
                s += 1
            hyper = AdamHyper.from_group(self.param_groups[gi], adamw=self.adamw)
            adamw_update(ps, gs, avgs, sqs, steps, hyper, grad_scale=grad_scale)
        self.refresh_params()
        self.zero_grad()
        self._stepped()
        return loss

    def refresh_params(self) -> None:
        """Write the updated fp32 shard into this rank's slice and all-gather every bucket."""
        for b in self.buckets:
            b.param.release()  # keeps the slice in the shard (a view of flat: no copy)
            if b.master is not None:
                b.param.payload.copy_(b.master.payload)
            b.param.gather(b.flat)
            self.comm_bytes["all_gather"] += b.param.full_bytes if self.world > 1 else 0

    # ----- introspection ------------------------------------------------------------------------
    @torch.no_grad()
    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The model's state dict with trainable parameters at their fp32 master values (float64
        under fp64; the masters are all-gathered: collective over the data-parallel group) and
        everything else as the model holds it, on the host."""
        out = {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}
        for b in self.buckets:
            if b.master is None:
                for name, p in b.params.items():
                    out[name] = p.detach().to(self.precision.state_dtype).cpu().clone()
                continue
            full = torch.empty(
                b.master.capacity, dtype=b.master.dtype, device=b.master.payload.device
            )
            b.master.gather(full)
            for name in b.params:
                out[name] = b.master.view(name).cpu().clone()
            b.master.release()
        for alias, p in self.model.named_parameters(remove_duplicate=False):
            canon = self.canonical_names.get(id(p))
            if canon is not None and canon != alias:
                out[alias] = out[canon]
        return out

    def model_state_bytes(self) -> dict[str, int]:
        """Bytes this rank holds now, by kind, counted from the storages themselves (each storage
        once): parameters (whole, compute dtype, frozen ones too), gradients (stage 1: the whole
        buffer; stage 2: the shard), fp32 masters and Adam moments (shards)."""
        seen: set[int] = set()

        def size(tensors: Iterable[torch.Tensor | None]) -> int:
            total = 0
            for t in tensors:
                if t is None:
                    continue
                s = t.untyped_storage()
                if s.data_ptr() not in seen:
                    seen.add(s.data_ptr())
                    total += s.nbytes()
            return total

        bs = self.buckets
        return {
            "params": size([b.flat for b in bs] + list(self.model.parameters())),
            "grads": size([b.grad_flat if b.grad_flat is not None else b.grad.shard for b in bs]),
            "masters": size([b.master.shard for b in bs if b.master is not None]),
            "optimizer_states": size([c.shard for b in bs for c in (b.exp_avg, b.exp_avg_sq)]),
        }
