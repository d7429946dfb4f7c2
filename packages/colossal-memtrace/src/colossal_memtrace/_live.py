"""Exact, device-independent accounting of the bytes held by live tensor storages.

[Note: live-tensor accounting] While a ``LiveTensorTracker`` is active (it is a torch dispatch
mode), every tensor an operator reads or returns is looked up by its storage (the address of the C++
``StorageImpl``). A storage is counted once, with ``nbytes()``, the first time it is seen, and
uncounted by the callback of a weak reference to the Python storage object, which torch keeps alive
exactly as long as the storage itself. Views share their base's storage and cost nothing; a storage
resized in place is re-measured the next time an operator returns it. Scratch memory a kernel
allocates and frees inside itself is not visible: the figures are the bytes operators hold between
calls, which is what a caching allocator is asked for. Storages made before the tracker started are
counted from their first use (or from ``track``). Works on any device, the meta device included, so
the same code gives exact figures on the CPU and predictions on meta.

Each storage is either *model data* (parameters, gradients, optimizer states: whatever was passed to
``mark_model``) or *non-model data* (activations, temporaries, buffers). Peaks of the total and of
the non-model part are kept per tier since the last ``cut``.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from colossal_contracts import MemorySample, TierName

__all__ = ["LiveTensorProbe", "LiveTensorTracker", "WindowPeak"]

_TIERS = (TierName.ACCELERATOR, TierName.HOST)


@dataclass(frozen=True)
class WindowPeak:
    """Peaks on one tier during one window (between two ``cut`` calls).

    Attributes:
        total: highest bytes held by live storages on the tier.
        non_model: highest non-model bytes (total minus model data) on the tier.
        model_at_end: model-data bytes on the tier when the window was cut.
    """

    total: int
    non_model: int
    model_at_end: int


def _tensors(container: Any) -> Iterator[torch.Tensor]:
    """The tensors in (nested) lists, tuples and dict values: all an aten operator takes or
    returns (its schema allows ``Tensor[]``, ``Tensor?[]`` and tuples of returns)."""
    for x in container.values() if isinstance(container, dict) else container:
        if isinstance(x, torch.Tensor):
            yield x
        elif isinstance(x, (list, tuple, dict)):
            yield from _tensors(x)


class _Entry(weakref.ref):
    """One counted storage: a weak reference to its Python object whose callback uncounts it."""

    __slots__ = ("key", "model", "nbytes", "tier")
    key: int  # the StorageImpl address
    model: bool
    nbytes: int
    tier: int  # index into _TIERS


class LiveTensorTracker(TorchDispatchMode):
    """Counts live storage bytes per tier, split into model and non-model data.

    Use as a context manager around the code to measure. ``compute_device`` is the device whose
    tensors count as the accelerator tier (the meta device always does too); other devices count
    as host. When the compute device is the CPU, the accelerator is emulated and every CPU byte is
    accelerator data. See [Note: live-tensor accounting] and [Note: tracker fast path].

    ``model_bytes_fn``, when given, replaces the model/non-model split by storage: model bytes on a
    tier are what it returns, and non-model = live bytes - that (clamped at 0). ``on_param_use`` is
    called with the name of every tracked parameter an operator reads (see ``watch_parameters``).
    """

    def __init__(
        self,
        compute_device: torch.device | str = "cpu",
        *,
        model_bytes_fn: Callable[[TierName], int] | None = None,
    ):
        super().__init__()
        self.compute_device = torch.device(compute_device)
        self.model_bytes_fn = model_bytes_fn
        self.on_param_use: Callable[[str], None] | None = None
        self._entries: dict[int, _Entry] = {}  # storage key -> entry
        self._params: dict[int, str] = {}  # storage key -> parameter name
        # Per tier index (see _TIERS): [non-model bytes, model bytes] held now, and the peaks.
        self._used = [[0, 0] for _ in _TIERS]
        self._win_total = [0] * len(_TIERS)
        self._win_non_model = [0] * len(_TIERS)
        self._peak_total = [0] * len(_TIERS)
        self._tier_index: dict[torch.device, int] = {}
        self.num_storages_seen = 0

    # -- accounting -------------------------------------------------------------------------
    def tier_of(self, device: torch.device) -> TierName:
        """The tier a tensor on ``device`` counts in."""
        if device.type in (self.compute_device.type, "meta"):
            return TierName.ACCELERATOR
        return TierName.HOST if device.type == "cpu" else TierName.ACCELERATOR

    def _tier_index_of(self, device: torch.device) -> int:
        i = self._tier_index.get(device)
        if i is None:
            i = self._tier_index[device] = _TIERS.index(self.tier_of(device))
        return i

    def _on_free(self, e: _Entry) -> None:
        # Weakref callback: the storage died. The identity check keeps a late callback from
        # uncounting a newer storage at the same address.
        if self._entries.get(e.key) is e:
            del self._entries[e.key]
            self._used[e.tier][e.model] -= e.nbytes

    def _add(self, s: torch.UntypedStorage, key: int, device: torch.device) -> _Entry:
        e = _Entry(s, self._on_free)
        e.key = key
        e.model = False
        e.nbytes = n = s.nbytes()
        e.tier = i = self._tier_index_of(device)
        self._entries[key] = e
        self.num_storages_seen += 1
        self._used[i][0] += n
        self._bump(i)
        return e

    def _see(self, t: torch.Tensor, *, model: bool = False) -> None:
        """Count ``t``'s storage if new (else re-measure it), report a parameter read, and with
        ``model`` reclassify the storage as model data."""
        try:
            s = t.untyped_storage()
        except (RuntimeError, NotImplementedError):  # sparse, nested, some subclasses
            return
        key = s._cdata
        e = self._entries.get(key)
        if e is None:
            e = self._add(s, key, t.device)
        else:
            self._resized(e, s)
        if self._params and self.on_param_use is not None:
            name = self._params.get(key)
            if name is not None:
                self.on_param_use(name)
        if model and not e.model:
            used = self._used[e.tier]
            used[0] -= e.nbytes
            used[1] += e.nbytes
            e.model = True

    def _resized(self, e: _Entry, s: torch.UntypedStorage) -> None:
        n = s.nbytes()
        if n != e.nbytes:
            self._used[e.tier][e.model] += n - e.nbytes
            e.nbytes = n
            self._bump(e.tier)

    def _non_model(self, i: int) -> int:
        used = self._used[i]
        if self.model_bytes_fn is None:
            return used[0]
        return max(0, used[0] + used[1] - self.model_bytes_fn(_TIERS[i]))

    def _bump(self, i: int) -> None:
        used = self._used[i]
        total = used[0] + used[1]
        if total > self._win_total[i]:
            self._win_total[i] = total
            if total > self._peak_total[i]:
                self._peak_total[i] = total
        nm = used[0] if self.model_bytes_fn is None else self._non_model(i)
        if nm > self._win_non_model[i]:
            self._win_non_model[i] = nm

    # [Note: tracker fast path] Every operator goes through __torch_dispatch__, so it does only
    # what the accounting needs: aten arguments are tensors, (nested) lists/tuples of them or
    # scalars, so they are walked directly instead of through a pytree; an input whose storage is
    # known costs one dict lookup (plus one for the parameter-use mark); outputs of view operators
    # share a storage their inputs already counted and are skipped (``OpOverload.is_view``, an
    # attribute read, cheaper than a dict keyed by operator); other outputs are counted if new,
    # else re-measured (an ``out=`` or ``resize_`` may have grown them). Parameter-use marks come
    # from inputs only: an operator that returns a parameter's storage also read it. Storages are
    # uncounted by a weak reference's callback (an ``_Entry``), not ``weakref.finalize`` and its
    # registry.
    def __torch_dispatch__(
        self,
        func: Callable[..., Any],
        types: Sequence[type],
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        entries = self._entries
        params = self._params if self.on_param_use is not None else None
        for a in args:
            if isinstance(a, torch.Tensor):
                self._see_input(a, entries, params)
            elif isinstance(a, (list, tuple, dict)):
                self._see_nested(a, entries, params)
        if kwargs:
            for a in kwargs.values():
                if isinstance(a, torch.Tensor):
                    self._see_input(a, entries, params)
                elif isinstance(a, (list, tuple, dict)):
                    self._see_nested(a, entries, params)
            out = func(*args, **kwargs)
        else:
            out = func(*args)
        if getattr(func, "is_view", False):
            return out
        if isinstance(out, torch.Tensor):
            self._see_output(out, entries)
        elif isinstance(out, (list, tuple)):
            for t in _tensors(out):
                self._see_output(t, entries)
        return out

    def _see_input(self, t: torch.Tensor, entries: dict, params: dict | None) -> None:
        try:
            s = t.untyped_storage()
        except (RuntimeError, NotImplementedError):  # sparse, nested, some subclasses
            return
        key = s._cdata
        if key not in entries:
            self._add(s, key, t.device)
        if params:
            name = params.get(key)
            if name is not None:
                use = self.on_param_use  # (params are given only with a callback)
                if use is not None:
                    use(name)

    def _see_output(self, t: torch.Tensor, entries: dict) -> None:
        try:
            s = t.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return
        key = s._cdata
        e = entries.get(key)
        if e is None:
            self._add(s, key, t.device)
        elif s.nbytes() != e.nbytes:
            self._resized(e, s)

    def _see_nested(self, a: Any, entries: dict, params: dict | None) -> None:
        for t in _tensors(a):
            self._see_input(t, entries, params)

    # -- public -----------------------------------------------------------------------------
    def track(self, tensors: Iterable[torch.Tensor], *, model: bool = False) -> None:
        """Count ``tensors`` now (if not yet counted); with ``model=True`` mark them model data."""
        for t in tensors:
            self._see(t, model=model)

    def mark_model(self, t: torch.Tensor) -> None:
        """Reclassify the storage of ``t`` (counted if new) as model data."""
        self._see(t, model=True)

    def watch_parameters(self, named: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Report reads of these parameters to ``on_param_use`` (by storage: views count too)."""
        self._params = {p.untyped_storage()._cdata: n for n, p in named}

    def used_bytes(self, tier: TierName, *, model: bool | None = None) -> int:
        """Live bytes on ``tier``: all of them, or only model (``True``) / non-model (``False``)."""
        used = self._used[_TIERS.index(TierName(tier))]
        return used[0] + used[1] if model is None else used[int(model)]

    def non_model_bytes(self, tier: TierName) -> int:
        """Live non-model bytes on ``tier`` now (through ``model_bytes_fn`` when set)."""
        return self._non_model(_TIERS.index(TierName(tier)))

    def peak_bytes(self, tier: TierName) -> int:
        """Highest total on ``tier`` since the tracker was made or ``reset_peak``."""
        return self._peak_total[_TIERS.index(TierName(tier))]

    def reset_peak(self) -> None:
        for i, used in enumerate(self._used):
            self._peak_total[i] = used[0] + used[1]

    def cut(self) -> dict[TierName, WindowPeak]:
        """Close the current window: its peaks per tier; the next window starts at current usage."""
        out = {}
        for i, tier in enumerate(_TIERS):
            used = self._used[i]
            total = used[0] + used[1]
            non_model = self._non_model(i)
            out[tier] = WindowPeak(self._win_total[i], self._win_non_model[i], total - non_model)
            self._win_total[i] = total
            self._win_non_model[i] = non_model
        return out

    def discount_window(self, tier: TierName, nbytes: int) -> None:
        """Take ``nbytes`` off the open window's non-model peak: bytes just reclassified as model
        data that had been model data since they were allocated."""
        i = _TIERS.index(TierName(tier))
        self._win_non_model[i] = max(self._non_model(i), self._win_non_model[i] - nbytes)

    def close(self) -> None:
        """Stop accounting for storages still alive (dropping their weak references drops their
        callbacks)."""
        self._entries.clear()
        self._used = [[0, 0] for _ in _TIERS]


class LiveTensorProbe:
    """A ``MemoryProbe`` over one tier of a ``LiveTensorTracker``: exact bytes of live storages.

    ``emulated`` is True when the tier is the accelerator and the tracker computes on the CPU.
    """

    def __init__(self, tracker: LiveTensorTracker, tier: TierName = TierName.ACCELERATOR):
        self.tracker = tracker
        self.tier = TierName(tier)
        self.name = f"live-tensors:{self.tier.value}"
        self._emulated = self.tier is TierName.ACCELERATOR and tracker.compute_device.type in (
            "cpu",
            "meta",
        )

    def sample(self) -> MemorySample:
        return MemorySample(
            used_bytes=self.tracker.used_bytes(self.tier),
            peak_bytes=self.tracker.peak_bytes(self.tier),
            emulated=self._emulated,
        )

    def reset_peak(self) -> None:
        self.tracker.reset_peak()
