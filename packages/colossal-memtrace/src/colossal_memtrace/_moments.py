"""``MomentRecorder``: per-moment memory of one step, for a runtime that cuts its own moments.

Gemini plans at the granularity of its runtime (one moment per operator that reads parameters,
forward and backward: [Note: moments] in colossal-contracts), finer than the hook tracer's
module boundaries. The runtime drives a ``MomentRecorder`` through the contract's
``StepRecorder`` (it does not import memtrace); the result is ``MemStats``, as from every other
tracer here. On the CPU (the emulated accelerator) the figures are live-tensor bytes ([Note:
live-tensor accounting]); on CUDA, the caching allocator's allocated bytes and their peak. Model
data is what the runtime reports (its chunk payloads); non-model = live - model.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

from colossal_contracts import ConfigError, TierName

from ._live import LiveTensorTracker, WindowPeak
from ._stats import MemStats, Moment, StepSummary

__all__ = ["MomentRecorder"]

_ACC, _HOST, _DISK = TierName.ACCELERATOR, TierName.HOST, TierName.DISK


class _Tracker(LiveTensorTracker):
    """A live-tensor tracker that can be stopped (pass-through) before it can be popped."""

    stopped = False

    def __torch_dispatch__(
        self,
        func: Callable[..., Any],
        types: Sequence[type],
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        if self.stopped:
            return func(*args, **(kwargs or {}))
        return super().__torch_dispatch__(func, types, args, kwargs)


class MomentRecorder:
    """A ``colossal_contracts.StepRecorder`` that produces ``MemStats``; see the module notes.

    ``compute_device`` is the accelerator ("cpu": emulated, counted with live tensors; "cuda":
    the allocator's counters). Moment ``i`` of the result is the ``i``-th ``cut``; whatever ran
    between ``start`` and the first cut is folded into moment 0.
    """

    def __init__(self, compute_device: torch.device | str = "cpu"):
        self.compute_device = torch.device(compute_device)
        self.cuda = self.compute_device.type == "cuda"
        self._tracker: _Tracker | None = None
        self._model_bytes: Callable[[TierName], int] = lambda tier: 0
        self._open: tuple[str, ...] | None = None
        self._phase = "forward"
        self._moments: list[Moment] = []
        self._head: dict[str, int] = {}  # non-model peak before the first cut

    # -- StepRecorder -----------------------------------------------------------------------
    def start(self, model_bytes: Callable[[TierName], int], model_tensors: Iterable[Any]) -> None:
        self.close()
        self._model_bytes = model_bytes
        self._moments, self._open, self._head = [], None, {}
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.compute_device)
            return
        tracker = _Tracker(self.compute_device, model_bytes_fn=self._model_fn)
        tracker.track(t for t in model_tensors if isinstance(t, torch.Tensor))
        tracker.cut()
        tracker.__enter__()
        self._tracker = tracker

    def cut(self, params: tuple[str, ...]) -> None:
        self._close_moment()
        self._open = tuple(params)
        self._phase = "backward" if torch._C._current_autograd_node() is not None else "forward"

    def finish(self) -> MemStats:
        self._close_moment()
        if self._tracker is not None:
            self._tracker.stopped = True
        moments = tuple(self._moments)
        summary = StepSummary(
            step=0,
            num_moments=len(moments),
            peak_total={_ACC.value: max((m.total_peak[_ACC.value] for m in moments), default=0)},
            peak_non_model={
                _ACC.value: max((m.non_model_peak[_ACC.value] for m in moments), default=0)
            },
            model_bytes_end=dict(moments[-1].model_bytes) if moments else {},
        )
        return MemStats(
            moments=moments,
            steps=(summary,),
            device=str(self.compute_device),
            emulated=not self.cuda,
            source="cuda-allocator" if self.cuda else "live-tensors",
            model_data="runtime",
            extra={"recorder": "moments"},
        )

    def close(self) -> None:
        """Pop the recorder's dispatch mode; modes entered after it (another runtime's recorder,
        still stopped until its runtime's next forward) stay active, in their order. On a thread
        other than the one that started it: ``ConfigError``, and the recorder stays open."""
        tracker = self._tracker
        if tracker is None:
            return
        _pop_from_stack(tracker)
        self._tracker = None
        tracker.close()

    # -- figures ----------------------------------------------------------------------------
    def _model_fn(self, tier: TierName) -> int:
        if tier is _ACC:  # emulated: every CPU chunk payload is a live CPU storage (disk
            # payloads too: they are memory-mapped CPU storages)
            return self._model_bytes(_ACC) + self._model_bytes(_HOST) + self._model_bytes(_DISK)
        return 0

    def _window(self) -> dict[TierName, WindowPeak]:
        if self._tracker is not None:
            return self._tracker.cut()
        dev = self.compute_device
        peak = torch.cuda.max_memory_allocated(dev)
        model = self._model_bytes(_ACC)
        torch.cuda.reset_peak_memory_stats(dev)
        return {_ACC: WindowPeak(peak, max(0, peak - model), model)}

    def _close_moment(self) -> None:
        if self._tracker is None and not self.cuda:
            return
        win = self._window()
        acc = win[_ACC]
        if self._open is None:  # before the first cut: folded into moment 0
            self._head = {_ACC.value: acc.non_model}
            return
        self._moments.append(
            Moment(
                index=len(self._moments),
                label=f"{self._phase}:{self._open[0] if self._open else ''}",
                phase=self._phase,
                params=self._open,
                model_bytes={_ACC.value: acc.model_at_end},
                non_model_peak={_ACC.value: max(acc.non_model, self._head.pop(_ACC.value, 0))},
                total_peak={_ACC.value: acc.total},
            )
        )


def _pop_from_stack(mode: TorchDispatchMode) -> None:
    """Exit ``mode`` wherever it is on this thread's dispatch-mode stack.

    [Note: recorders of two runtimes] A recorder's mode cannot be popped where its step ends
    (inside backward: the autograd engine restores the mode stack it started with), so it stops
    there and is popped at its runtime's next forward. Two runtimes stepped alternately in one
    process (two models, or one method timed against another) then close recorders out of
    order: the other runtime's mode, entered later, is above this one. The modes above are
    exited and re-entered around this one's exit (base-class enter and exit: their state is
    untouched), so each restores the flags it saved and the stack keeps their order.
    """
    stack = _get_current_dispatch_mode_stack()
    if mode not in stack:
        raise ConfigError(
            "MomentRecorder: its dispatch mode is not active on this thread; close the recorder "
            "on the thread that started it"
        )
    above = stack[stack.index(mode) + 1 :]
    for m in reversed(above):
        TorchDispatchMode.__exit__(m, None, None, None)
    TorchDispatchMode.__exit__(mode, None, None, None)
    for m in above:
        TorchDispatchMode.__enter__(m)
