"""Static estimate: run a training step on the meta device through the hook tracer.

[Note: static estimate] Meta tensors have shapes, dtypes and storages of the right size but no
memory, so a step on meta allocates nothing while the live-tensor tracker counts exactly the
storages the real step would hold. Two things can differ from a real run: kernels that pick an
implementation by device (scaled-dot-product attention runs its math form on meta, materialising
the (B, H, T, T) scores, where the CPU and CUDA pick fused kernels: ``target`` makes meta call the
fused kernel the target would use), and kernel-internal scratch memory, which is invisible in both.

[Note: attention mimic in recompute] Torch function modes are not active in backward, where
``torch.utils.checkpoint`` (non-reentrant) recomputes a region: its recompute would run the math
attention and materialise scores forward never had (on meta the recomputed shapes then differ from
the saved ones, and checkpoint raises). So inside a region, where checkpoint's saved-tensor hooks
are installed, every call the mode sees runs under hooks that hand each saved tensor to
checkpoint's pack and run checkpoint's unpack, which is what recomputes, inside a fresh mimic.
The live-tensor tracker is a dispatch mode, which backward keeps, so it counts the recompute.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch._C._autograd import _top_saved_tensors_default_hooks
from torch.autograd.graph import saved_tensors_hooks
from torch.overrides import TorchFunctionMode

from colossal_contracts import ConfigError

from ._hooks import HookTracer, TraceConfig
from ._stats import MemStats

__all__ = ["estimate_step", "run_step", "trace_step"]

_SDPA_ARGS = ("attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
TARGETS = ("cpu", "cuda")


class _Outer:
    """What an outer pack hook (checkpoint's) returned, with the unpack hook that takes it."""

    __slots__ = ("packed", "unpack")

    def __init__(self, packed: Any, unpack: Callable[[Any], torch.Tensor]):
        self.packed, self.unpack = packed, unpack


class _FusedAttentionOnMeta(TorchFunctionMode):
    """Route ``F.scaled_dot_product_attention`` on meta to the fused kernel ``target`` would use,
    in checkpoint's recompute too ([Note: attention mimic in recompute])."""

    def __init__(self, target: str):
        super().__init__()
        self.target = target

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Sequence[type],
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        outer = _top_saved_tensors_default_hooks(False)
        if outer is None:
            return self._call(func, args, kwargs)
        pack_outer, unpack_outer = outer

        def pack(t: torch.Tensor) -> _Outer:
            return _Outer(pack_outer(t), unpack_outer)

        def unpack(x: _Outer) -> torch.Tensor:
            with _FusedAttentionOnMeta(self.target):  # checkpoint may recompute here
                return x.unpack(x.packed)

        with saved_tensors_hooks(pack, unpack):
            return self._call(func, args, kwargs)

    def _call(self, func: Any, args: Any, kwargs: Any) -> Any:
        kwargs = dict(kwargs or {})
        if func is not F.scaled_dot_product_attention or args[0].device.type != "meta":
            return func(*args, **kwargs)
        kwargs.update(zip(_SDPA_ARGS, args[3:]))
        q, k, v = args[:3]
        if kwargs.get("attn_mask") is not None or kwargs.get("enable_gqa"):
            return func(q, k, v, **kwargs)  # the fused kernels below take neither
        p, causal, scale = (
            kwargs.get("dropout_p", 0.0),
            kwargs.get("is_causal", False),
            kwargs.get("scale"),
        )
        if self.target == "cpu":
            ops = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
            return ops(q, k, v, p, causal, scale=scale)[0]
        if q.dtype in (torch.float16, torch.bfloat16) and q.shape[-1] <= 256:
            ops = torch.ops.aten._scaled_dot_product_flash_attention
            return ops(q, k, v, p, causal, False, scale=scale)[0]
        return func(q, k, v, **kwargs)


def run_step(
    model: nn.Module,
    inputs: Sequence[Any],
    *,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    optimizer: torch.optim.Optimizer | None = None,
) -> None:
    """One training step: ``loss_fn(model(*inputs))`` (or the model's output when it is already
    a scalar loss), backward, then ``optimizer.step()`` and ``zero_grad()`` when given."""
    out = model(*inputs)
    loss = loss_fn(out) if loss_fn is not None else out
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        raise ConfigError(
            "the step needs a scalar loss: the model returned "
            f"{tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__}; "
            "pass loss_fn=... (e.g. lambda out: out.sum())"
        )
    loss.backward()
    del out, loss
    if optimizer is not None:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def trace_step(
    model: nn.Module,
    inputs: Sequence[Any],
    *,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    config: TraceConfig | None = None,
) -> MemStats:
    """Trace one real training step of ``model`` with the hook tracer; return its ``MemStats``."""
    tracer = HookTracer(model, optimizer=optimizer, config=config)
    with tracer.step():
        run_step(model, inputs, loss_fn=loss_fn, optimizer=optimizer)
    return tracer.stats


def estimate_step(
    build_model: Callable[[], nn.Module],
    make_inputs: Callable[[torch.device], Sequence[Any]],
    *,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    build_optimizer: Callable[[Any], torch.optim.Optimizer] | None = None,
    target: str = "cpu",
    config: TraceConfig | None = None,
) -> MemStats:
    """Predict the memory of one training step without allocating it (see [Note: static estimate]).

    ``build_model()`` is called under ``torch.device("meta")``; ``make_inputs(device)`` returns the
    model's positional inputs on ``device``; ``build_optimizer(params)`` (e.g. ``torch.optim.Adam``)
    adds the optimizer step. ``target`` (``cpu`` or ``cuda``) picks the attention kernel to mimic.
    """
    if target not in TARGETS:
        raise ConfigError(f"estimate_step target must be one of {TARGETS}, got {target!r}")
    meta = torch.device("meta")
    with torch.device(meta):
        model = build_model()
    model.to(meta)  # a model that ignored the default device
    inputs = make_inputs(meta)
    optimizer = build_optimizer(model.parameters()) if build_optimizer is not None else None
    cfg = config or TraceConfig()
    cfg = TraceConfig(cfg.warmup_steps, cfg.cut_on_param_use, compute_device="meta")
    tracer = HookTracer(model, optimizer=optimizer, config=cfg)
    for _ in range(cfg.warmup_steps):
        with tracer.step(), _FusedAttentionOnMeta(target):
            run_step(model, inputs, loss_fn=loss_fn, optimizer=optimizer)
    s = tracer.stats
    extra = {**s.extra, "target": target}
    return MemStats(s.moments, s.steps, "meta", True, "static-estimate", s.model_data, extra)
