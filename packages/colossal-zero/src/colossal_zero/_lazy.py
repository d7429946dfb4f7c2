"""Lazy initialization: build a model on the meta device, materialize each tensor later, alone.

[Note: lazy init] Inside ``LazyInit()`` every tensor a model's constructor creates lives on the
meta device (no memory), and every operation that creates or writes a meta storage is recorded
against that storage: the factory call, then each in-place write (``normal_``, ``fill_``,
``copy_``, ``__setitem__``, ``out=``) in order. Each recorded operation is also run once on
scratch CPU tensors of the same shapes, so that the CPU random generator advances exactly as eager
construction would (the generator's state after the ``with`` block equals eager construction's);
one that moved the generator records the state before it. ``materialize(t)`` replays ``t``'s storage's record on
the CPU (with the recorded generator state around each random operation, restoring the caller's
after), which gives bit for bit the values eager construction gives under the same seed, and
needs only that storage's bytes (plus the storages its record reads). Gemini materializes
parameters chunk by chunk straight into their tier, so host memory during setup holds one chunk's
tensors at most.

Limits: values computed from meta tensors inside the constructor (``.item()``, Python branches
on tensor values) cannot be recorded; such models fail with the meta device's own error.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._device import _device_constructors
from torch.utils._pytree import tree_map

from colossal_chunk import host_empty, trim_host_heap
from colossal_contracts import ConfigError

__all__ = ["LazyInit", "LazyValues"]

_WRITES = frozenset({"__setitem__", "copy_"})
# factories whose values a fresh anonymous mapping already has (zeros; "empty" promises nothing)
_ZERO_FACTORIES = frozenset({torch.empty, torch.zeros})


@dataclass
class _Op:
    func: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    rng: torch.Tensor | None  # CPU generator state before a random op


@dataclass
class _Record:
    ops: list[_Op] = field(default_factory=list)  # ops[0] created the storage


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def _is_meta(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.is_meta


class LazyInit(TorchFunctionMode):
    """A context in which models are built on the meta device; see [Note: lazy init].

    ``with LazyInit() as lazy: model = GPT(cfg)``, then ``lazy.materialize(p)`` for any of its
    meta tensors (``apply_gemini(model, lazy=lazy)`` does it chunk by chunk).
    """

    def __init__(self) -> None:
        super().__init__()
        self._records: dict[int, _Record] = {}
        # tensors made from Python data stay real: they are data, not allocations (and
        # libraries probe the default device with ``torch.tensor([])``)
        self._factories = _device_constructors() - {torch.tensor, torch.as_tensor, torch.asarray}

    def __enter__(self) -> LazyInit:
        super().__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        trim_host_heap()  # what the dry runs left in the C heap

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Sequence[type],
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = dict(kwargs or {})
        if func in self._factories and kwargs.get("device") is None:
            # the meta device is given to each factory, not set as the default device: libraries
            # that skip initialization under a meta default (Hugging Face) initialize as eagerly
            kwargs["device"] = "meta"
        name = getattr(func, "__name__", "")
        rng = torch.get_rng_state()
        out = func(*args, **kwargs)
        target = None
        if (name.endswith("_") and not name.startswith("__")) or name in _WRITES:
            first = args[0] if args else kwargs.get("tensor")  # torch.nn.init passes tensor=
            target = first if _is_meta(first) else None
        elif _is_meta(kwargs.get("out")):
            target = kwargs["out"]
        # hold aliases, not the objects: a Parameter's object is later swapped to real storage
        alias = lambda x: x.detach() if _is_meta(x) else x  # noqa: E731
        op = _Op(func, tree_map(alias, tuple(args)), tree_map(alias, kwargs), None)
        if target is not None:
            self._record_for(target).ops.append(op)
        else:
            fresh = [
                t
                for t in (out if isinstance(out, tuple | list) else (out,))
                if _is_meta(t) and _storage(t) not in self._records
            ]
            if not fresh:
                return out  # a view or a query: nothing to replay
            for t in fresh:
                self._records[_storage(t)] = _Record([op])
        # run it once on scratch CPU tensors: a random op (also one inside torch.nn.init's
        # helpers) advances the generator as eager construction does, and is marked random
        self._run(op, {}, scratch=True)
        if not torch.equal(torch.get_rng_state(), rng):
            op.rng = rng
        return out

    def _record_for(self, t: torch.Tensor) -> _Record:
        rec = self._records.get(_storage(t))
        if rec is None:  # a storage the record has not seen being made: its bytes are unset
            raise ConfigError(
                "lazy init saw a write to a meta tensor it did not see created; build the whole "
                "model inside colossal.lazy_init()"
            )
        return rec

    # ----- materializing ------------------------------------------------------------------------
    def records(self, t: torch.Tensor) -> bool:
        """True if ``t`` is a meta tensor whose values this context can materialize."""
        return t.is_meta and _storage(t) in self._records

    def materialize(self, t: torch.Tensor) -> torch.Tensor:
        """``t``'s values on the CPU, bit-identical to eager construction (a new tensor)."""
        if not self.records(t):
            raise ConfigError(
                f"a meta tensor of shape {tuple(t.shape)} was not built inside this lazy_init(); "
                "build the model inside it, or build it eagerly"
            )
        base = self._replay(_storage(t), {})
        out = _view(base, t)
        if _spans_storage(out):
            return out  # the storage is t's alone: no copy
        return out.clone()

    def assign(self, t: torch.Tensor, load: Callable[[], torch.Tensor]) -> None:
        """From now on ``t``'s values are ``load()``'s (any dtype, converted to ``t``'s; read
        when ``t`` is materialized), not its recorded initialization's: a saved checkpoint's
        tensor read alone. ``t`` must span its whole storage; the generator is not touched."""
        rec = self._record_for(t)
        if not _spans_storage(t):
            raise ConfigError(
                f"lazy init cannot load a view of shape {tuple(t.shape)} alone; load its whole "
                "tensor, or build the model eagerly"
            )
        fresh = _Op(torch.empty, (tuple(t.shape),), {"dtype": t.dtype}, None)
        rec.ops = [fresh, _Op(_load_into, (t.detach(), load), {}, None)]

    def forget(self, t: torch.Tensor) -> None:
        """Drop ``t``'s record once it is materialized (frees what the record holds)."""
        self._records.pop(_storage(t), None)

    def _replay(self, sid: int, done: dict[int, torch.Tensor]) -> torch.Tensor:
        if sid in done:
            return done[sid]
        first, *rest = self._records[sid].ops
        out = self._run(first, done)
        created = next(
            t for t in (out if isinstance(out, tuple | list) else (out,))
            if isinstance(t, torch.Tensor)
        )  # fmt: skip
        done[sid] = created
        for op in rest:
            self._run(op, done)
        return created

    def _run(self, op: _Op, done: dict[int, torch.Tensor], *, scratch: bool = False) -> Any:
        def real(x: Any) -> Any:
            if _is_meta(x):
                if scratch:
                    return _scratch(x)
                return _view(self._replay(_storage(x), done), x)
            if isinstance(x, torch.device) and x.type == "meta":
                return torch.device("cpu")
            if isinstance(x, str) and x == "meta":
                return "cpu"
            return x

        if op.func in _ZERO_FACTORIES and not any(map(_is_meta, op.args)):
            with torch.no_grad():  # a new storage of zeros: in its own mapping, not the heap
                return _scratch(op.func(*op.args, **op.kwargs))
        args, kwargs = tree_map(real, op.args), tree_map(real, op.kwargs)
        saved = None
        if op.rng is not None and not scratch:
            saved = torch.get_rng_state()
            torch.set_rng_state(op.rng)
        try:
            with torch.no_grad():
                return op.func(*args, **kwargs)
        finally:
            if saved is not None:
                torch.set_rng_state(saved)


def _spans_storage(t: torch.Tensor) -> bool:
    """``t`` is its whole storage: contiguous from its start to its end."""
    whole = t.storage_offset() == 0 and t.is_contiguous()
    return whole and t.numel() * t.element_size() == t.untyped_storage().nbytes()


def _load_into(dst: torch.Tensor, load: Callable[[], torch.Tensor]) -> torch.Tensor:
    value = load()
    if value.shape != dst.shape:
        raise ConfigError(
            f"a saved tensor of shape {tuple(value.shape)} was given to a parameter of shape "
            f"{tuple(dst.shape)}; the checkpoint does not belong to this model"
        )
    return dst.copy_(value)


def _scratch(like: torch.Tensor) -> torch.Tensor:
    """A CPU tensor of zeros with ``like``'s shape, strides and dtype, in its own mapping (for
    dry runs and materialized storages): from the heap, one after another, they grew the
    process by about the model's size ([Note: host payloads] in colossal-chunk)."""
    if like.numel() == 0:
        return torch.empty_strided(like.shape, like.stride(), dtype=like.dtype)
    span = 1 + sum((n - 1) * st for n, st in zip(like.shape, like.stride(), strict=True))
    return host_empty(span, like.dtype).as_strided(like.shape, like.stride())


def _view(base: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The real tensor over ``base``'s storage with ``like``'s dtype, offset, shape and strides."""
    out = torch.empty(0, dtype=like.dtype)
    return out.set_(base.untyped_storage(), like.storage_offset(), like.shape, like.stride())


class LazyValues:
    """The meta parameters of a model built inside a ``LazyInit``, for Gemini's setup.

    ``swap_out()`` gives each meta parameter a one-element CPU placeholder of its shape and dtype
    (``torch.utils.swap_tensors``: the ``nn.Parameter`` objects, and optimizers holding them, stay
    the same); ``fill(p)`` is then ``p``'s value in its dtype, ``original(p)`` in the dtype it was
    built with, both materialized anew ([Note: lazy init]). Falsy when nothing is on meta.
    """

    def __init__(self, named: list[tuple[str, torch.nn.Parameter]], lazy: LazyInit | None):
        self._meta = {id(p): p.data for _, p in named if p.is_meta}  # the recorded tensors
        self._params = [p for _, p in named if p.is_meta]
        self._lazy = lazy
        if self._meta and (lazy is None or not all(lazy.records(t) for t in self._meta.values())):
            first = next(n for n, p in named if p.is_meta)
            raise ConfigError(
                f"parameter {first!r} is on the meta device with nothing to fill it from; build "
                "the model inside colossal.lazy_init() (colossal_zero.LazyInit) and pass it as lazy="
            )

    def __bool__(self) -> bool:
        return bool(self._meta)

    def swap_out(self) -> None:
        for p in self._params:
            stub = torch.zeros((), dtype=p.dtype).expand(p.shape)
            torch.utils.swap_tensors(p, torch.nn.Parameter(stub, requires_grad=p.requires_grad))
        self._params = []

    def fill(self, p: torch.Tensor) -> torch.Tensor:
        meta = self._meta.get(id(p))
        return p.data if meta is None else self.original(p).to(p.dtype)

    def original(self, p: torch.Tensor) -> torch.Tensor:
        assert self._lazy is not None
        return self._lazy.materialize(self._meta[id(p)])

    def buffer(self, t: torch.Tensor) -> torch.Tensor:
        if self._lazy is None or not self._lazy.records(t):
            raise ConfigError(
                f"a buffer of shape {tuple(t.shape)} is on the meta device with nothing to fill "
                "it from; build the model inside colossal.lazy_init() and pass it as lazy="
            )
        return self._lazy.materialize(t)
