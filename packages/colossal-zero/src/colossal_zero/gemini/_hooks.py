"""The operator hooks of Gemini's runtime ([Note: operator hooks] in ``_runtime.py``): a
``TorchFunctionMode`` around every call that reads parameters, and the identity autograd functions
that re-access parameters before an operator's backward and release, after it, the parameters
no gradient hook would release then.

Each hook runs under a ``torch.profiler.record_function`` label (``Gemini::pre_forward``,
``Gemini::post_forward``, ``Gemini::pre_backward``, ``Gemini::post_backward``, and the runtime's
``Gemini::post_accumulate_grad``, ``Gemini::reduce_scatter``, ``Gemini::gather_ahead``,
``Gemini::finish_backward``) while a profiler runs, so that a profile reads like the design."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

import torch
from torch._C._autograd import _profiler_enabled
from torch.overrides import TorchFunctionMode
from torch.profiler import record_function
from torch.utils._pytree import tree_flatten, tree_unflatten

from ._saved import recompute_hooks, saved_param_views
from ._state import TrainingState

if TYPE_CHECKING:
    from ._runtime import GeminiRuntime

__all__ = ["AccessMode", "label"]

_NO_LABEL = nullcontext()


def label(name: str) -> AbstractContextManager[Any]:
    """``record_function(name)`` while a profiler runs, else a shared no-op context (a label
    costs microseconds per operator even when nothing records it)."""
    return record_function(name) if _profiler_enabled() else _NO_LABEL


class _PreBackward(torch.autograd.Function):
    """Identity in forward; in backward, accesses the operator's parameters first."""

    @staticmethod
    def forward(ctx: Any, rt: GeminiRuntime, names: tuple[str, ...], *outs: torch.Tensor) -> Any:
        ctx.rt, ctx.names = rt, names
        # [Note: gradients in parts] in _collect.py: a reader whose backward is to come
        rt.count_reader(ctx, names, forward=rt.state is TrainingState.FORWARD)
        return outs if len(outs) > 1 else outs[0]

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        with label("Gemini::pre_backward"):
            ctx.rt.reader_backward(ctx)
            ctx.rt.pre_backward(ctx.names)
        return (None, None, *grads)


class _PostBackward(torch.autograd.Function):
    """Identity on an operator's input; in backward (after the operator's), releases the
    parameters it read that no gradient hook releases now ([Note: released after backward])."""

    @staticmethod
    def forward(ctx: Any, rt: GeminiRuntime, names: tuple[str, ...], x: torch.Tensor) -> Any:
        ctx.rt, ctx.names = rt, names
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        with label("Gemini::post_backward"):
            ctx.rt.post_backward(ctx.names)
        return None, None, grad


class AccessMode(TorchFunctionMode):
    """See [Note: operator hooks]."""

    def __init__(self, rt: GeminiRuntime):
        super().__init__()
        self.rt = rt

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Sequence[type],
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        names = self.rt.params_in(args, kwargs)
        if names and self.rt.resident:  # [Note: resident steps]: nothing to access or wrap
            self.rt.resident_op(names)
            names = ()
        if not names:
            hooks = recompute_hooks(self._replay) if torch.is_grad_enabled() else None
            if hooks is None:
                return func(*args, **kwargs)
            with hooks:  # [Note: checkpointed regions]
                return func(*args, **kwargs)
        later = self.rt.released_after_backward(names)  # before pre_op marks them read
        with label("Gemini::pre_forward"):
            self.rt.pre_op(names)
        if later and torch.is_grad_enabled():
            args = tuple(
                _PostBackward.apply(self.rt, later, a)
                if isinstance(a, torch.Tensor) and a.requires_grad and id(a) not in self.rt.names
                else a
                for a in args
            )
        try:
            if torch.is_grad_enabled():  # [Note: saved parameter views]
                chunks = {self.rt.index.chunk(n) for n in names}
                with saved_param_views(self.rt.manager, chunks, self._replay):
                    out = func(*args, **kwargs)
            else:
                out = func(*args, **kwargs)
        finally:
            with label("Gemini::post_forward"):
                self.rt.post_op(names)
        return _wrap_outputs(self.rt, names, out)

    def _replay(self) -> AccessMode:
        """The context a checkpointed region is recomputed in: this mode."""
        return self


def _wrap_outputs(rt: GeminiRuntime, names: tuple[str, ...], out: Any) -> Any:
    """Pass every output tensor that needs a gradient, wherever it sits in ``out`` (a tensor, a
    tuple with ``None`` in it such as ``nn.MultiheadAttention``'s, a named tuple, a dict),
    through one ``_PreBackward``: any of their gradients re-accesses the parameters."""
    if not torch.is_grad_enabled():
        return out
    if isinstance(out, torch.Tensor):
        return _PreBackward.apply(rt, names, out) if out.requires_grad else out
    leaves, spec = tree_flatten(out)
    idx = [i for i, t in enumerate(leaves) if isinstance(t, torch.Tensor) and t.requires_grad]
    if not idx:
        return out
    wrapped = _PreBackward.apply(rt, names, *(leaves[i] for i in idx))
    wrapped = wrapped if isinstance(wrapped, tuple) else (wrapped,)
    for i, t in zip(idx, wrapped, strict=True):
        leaves[i] = t
    return tree_unflatten(leaves, spec)
