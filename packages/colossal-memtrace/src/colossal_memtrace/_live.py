"""Exact, device-independent accounting of the bytes held by live tensor storages.

[Note: live-tensor accounting] While a ``LiveTensorTracker`` is active (it is a torch dispatch
mode), every tensor an operator reads or returns is looked up by its storage (the address of the
C++ ``StorageImpl``). A storage is counted once, with ``nbytes()``, the first time it is seen, and
uncounted by a ``weakref.finalize`` on the Python storage object, which torch keeps alive exactly as
long as the storage itself. Views share their base's storage and cost nothing; a storage resized in
place is re-measured the next time an operator returns it. Scratch memory a kernel allocates and
frees inside itself is not visible: the figures are the bytes operators hold between calls, which
is what a caching allocator is asked for. Storages made before the tracker started are counted from
their first use (or from ``track``). Works on any device, the meta device included, so the same
code gives exact figures on the CPU and predictions on meta.

Each storage is either *model data* (parameters, gradients, optimizer states: whatever was passed to
``mark_model``) or *non-model data* (activations, temporaries, buffers). Peaks of the total and of
the non-model part are kept per tier since the last ``cut``.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

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


class _Entry:
    __slots__ = ("finalizer", "model", "nbytes", "tier")

    def __init__(self, nbytes: int, tier: TierName, model: bool):
        self.nbytes = nbytes
        self.tier = tier
        self.model = model
        self.finalizer: weakref.finalize | None = None


class LiveTensorTracker(TorchDispatchMode):
    """Counts live storage bytes per tier, split into model and non-model data.

    Use as a context manager around the code to measure. ``compute_device`` is the device whose
    tensors count as the accelerator tier (the meta device always does too); other devices count
    as host. When the compute device is the CPU, the accelerator is emulated and every CPU byte is
    accelerator data. See [Note: live-tensor accounting].

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
        self._entries: dict[int, _Entry] = {}
        self._params: dict[int, str] = {}  # storage key -> parameter name
        self._used = {t: [0, 0] for t in _TIERS}  # tier -> [non-model bytes, model bytes]
        self._win_total = dict.fromkeys(_TIERS, 0)
        self._win_non_model = dict.fromkeys(_TIERS, 0)
        self._peak_total = dict.fromkeys(_TIERS, 0)
        self.num_storages_seen = 0

    # -- accounting -------------------------------------------------------------------------
    def tier_of(self, device: torch.device) -> TierName:
        """The tier a tensor on ``device`` counts in."""
        if device.type in (self.compute_device.type, "meta"):
            return TierName.ACCELERATOR
        return TierName.HOST if device.type == "cpu" else TierName.ACCELERATOR

    def _release(self, key: int) -> None:
        e = self._entries.pop(key, None)
        if e is not None:
            self._used[e.tier][e.model] -= e.nbytes

    def _see(self, t: torch.Tensor, *, output: bool) -> None:
        try:
            s = t.untyped_storage()
        except (RuntimeError, NotImplementedError):  # sparse, nested, some subclasses
            return
        key = s._cdata
        e = self._entries.get(key)
        if e is None:
            e = _Entry(s.nbytes(), self.tier_of(t.device), False)
            e.finalizer = weakref.finalize(s, self._release, key)
            e.finalizer.atexit = False
            self._entries[key] = e
            self._used[e.tier][0] += e.nbytes
            self.num_storages_seen += 1
            self._bump(e.tier)
        elif output:
            n = s.nbytes()
            if n != e.nbytes:
                self._used[e.tier][e.model] += n - e.nbytes
                e.nbytes = n
                self._bump(e.tier)
        if self._params and self.on_param_use is not None:
            name = self._params.get(key)
            if name is not None:
                self.on_param_use(name)

    def _non_model(self, tier: TierName) -> int:
        used = self._used[tier]
        if self.model_bytes_fn is None:
            return used[0]
        return max(0, used[0] + used[1] - self.model_bytes_fn(tier))

    def _bump(self, tier: TierName) -> None:
        used = self._used[tier]
        total = used[0] + used[1]
        if total > self._win_total[tier]:
            self._win_total[tier] = total
            if total > self._peak_total[tier]:
                self._peak_total[tier] = total
        nm = self._non_model(tier)
        if nm > self._win_non_model[tier]:
            self._win_non_model[tier] = nm

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        for t in tree_flatten((args, kwargs))[0]:
            if isinstance(t, torch.Tensor):
                self._see(t, output=False)
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self._see(t, output=True)
        return out

    # -- public -----------------------------------------------------------------------------
    def track(self, tensors: Iterable[torch.Tensor], *, model: bool = False) -> None:
        """Count ``tensors`` now (if not yet counted); with ``model=True`` mark them model data."""
        for t in tensors:
            self._see(t, output=True)
            if model:
                self.mark_model(t)

    def mark_model(self, t: torch.Tensor) -> None:
        """Reclassify the storage of ``t`` (counted if new) as model data."""
        self._see(t, output=True)
        e = self._entries.get(t.untyped_storage()._cdata)
        if e is not None and not e.model:
            self._used[e.tier][0] -= e.nbytes
            self._used[e.tier][1] += e.nbytes
            e.model = True

    def watch_parameters(self, named: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Report reads of these parameters to ``on_param_use`` (by storage: views count too)."""
        self._params = {p.untyped_storage()._cdata: n for n, p in named}

    def used_bytes(self, tier: TierName, *, model: bool | None = None) -> int:
        """Live bytes on ``tier``: all of them, or only model (``True``) / non-model (``False``)."""
        used = self._used[TierName(tier)]
        return used[0] + used[1] if model is None else used[int(model)]

    def non_model_bytes(self, tier: TierName) -> int:
        """Live non-model bytes on ``tier`` now (through ``model_bytes_fn`` when set)."""
        return self._non_model(TierName(tier))

    def peak_bytes(self, tier: TierName) -> int:
        """Highest total on ``tier`` since the tracker was made or ``reset_peak``."""
        return self._peak_total[TierName(tier)]

    def reset_peak(self) -> None:
        for tier in _TIERS:
            self._peak_total[tier] = self.used_bytes(tier)

    def cut(self) -> dict[TierName, WindowPeak]:
        """Close the current window: its peaks per tier; the next window starts at current usage."""
        out = {}
        for tier in _TIERS:
            model = self.used_bytes(tier) - self._non_model(tier)
            out[tier] = WindowPeak(self._win_total[tier], self._win_non_model[tier], model)
            self._win_total[tier] = self.used_bytes(tier)
            self._win_non_model[tier] = self._non_model(tier)
        return out

    def discount_window(self, tier: TierName, nbytes: int) -> None:
        """Take ``nbytes`` off the open window's non-model peak: bytes just reclassified as model
        data that had been model data since they were allocated."""
        tier = TierName(tier)
        self._win_non_model[tier] = max(self._non_model(tier), self._win_non_model[tier] - nbytes)

    def close(self) -> None:
        """Stop accounting for storages still alive (their finalizers are detached)."""
        for e in self._entries.values():
            if e.finalizer is not None:
                e.finalizer.detach()
        self._entries.clear()
        self._used = {t: [0, 0] for t in _TIERS}


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
