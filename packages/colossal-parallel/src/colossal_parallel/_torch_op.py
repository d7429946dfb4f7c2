"""``torch_function_op``: a parallel operator that ``TorchFunctionMode``s see as one call.

[Note: operators a mode sees] A custom ``torch.autograd.Function``'s ``apply`` does not go
through ``__torch_function__``: a mode active around it (Gemini's operator hooks, which bring a
parameter's chunk to the compute tier before a call that reads it and release it after) sees
only the plain torch calls inside ``forward``, one at a time, and not the parameter handed to
``apply``. The ``Function`` then records the parameter as it is at rest (on a sharded chunk an
empty tensor), and its backward's gradient no longer matches that shape; whatever it saves for
backward was saved outside any access. Wrapping the public function with
``torch_function_op`` lets a mode take the whole operator as one call over its tensor
arguments (parameters included), as it takes ``F.linear``; with no mode and no tensor subclass
it costs one check.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import torch
from torch.overrides import handle_torch_function, has_torch_function

__all__ = ["torch_function_op"]

_P = ParamSpec("_P")
_R = TypeVar("_R")


def torch_function_op(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """``fn`` made visible to ``__torch_function__`` handlers ([Note: operators a mode sees]):
    its positional tensor arguments are the ones a handler is told about."""

    @functools.wraps(fn)
    def op(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        tensors = tuple(a for a in args if isinstance(a, torch.Tensor))
        if tensors and has_torch_function(tensors):
            return handle_torch_function(op, tensors, *args, **kwargs)
        return fn(*args, **kwargs)

    return op
