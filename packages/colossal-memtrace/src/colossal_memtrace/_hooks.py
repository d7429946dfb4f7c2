"""The hook tracer: cut a training step into moments and record memory for each.

[Note: moments] A moment opens at each of these boundaries and lasts until the next one:
- ``fwd:<module>``: forward pre-hook of a module that owns parameters directly;
  ``recompute:<module>`` (phase ``backward``) when that forward runs again in backward, in a
  ``torch.utils.checkpoint`` region;
- ``bwd:<module>``: the gradient of that module's output is ready (a tensor hook on its output),
  i.e. its backward is about to run;
- ``use:<parameter>``: an operator read a parameter that the open moment did not declare (a tied
  output head, a parameter used functionally) -- a parameter-access mark;
- ``optimizer``: ``optimizer.step`` was called (its pre-hook); ``start``: the step began;
  ``tracer.mark(label)`` opens one by hand.
Moment ``i``'s parameters are those its module owns plus any others read during it, in order of
use: the compute order. Its figures are the live-tensor peaks of [Note: live-tensor accounting].

[Note: model data] With no ``ModelDataSource``, model data is the storages of the model's
parameters, of their ``.grad`` (from the moment autograd accumulates it: a post-accumulate-grad
hook), and of the optimizer's state tensors (after each ``optimizer.step``). Everything else,
buffers included, is non-model data. Consequence: on the first step, optimizer states created
inside ``step`` count as non-model until ``step`` returns. With sources, model bytes on a tier are
the sum of what the sources report for it, and non-model = live bytes - model bytes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from colossal_contracts import ConfigError, TierName

from ._live import LiveTensorTracker, WindowPeak
from ._sources import ModelDataSource
from ._stats import MemStats, Moment, StepSummary

__all__ = ["HookTracer", "TraceConfig"]


@dataclass(frozen=True)
class TraceConfig:
    """How the hook tracer cuts and collects.

    Attributes:
        warmup_steps: steps traced before the statistics freeze (>= 1); later steps run untraced.
            With several, each figure is the maximum over them (when they cut the same moments).
        cut_on_param_use: open a ``use:`` moment when a parameter is read outside its module's
            moment (see [Note: moments]); False folds such reads into the open moment.
        compute_device: the device whose tensors are the accelerator tier; None means the device
            of the model's first parameter.
    """

    warmup_steps: int = 1
    cut_on_param_use: bool = True
    compute_device: str | None = None

    def __post_init__(self) -> None:
        if self.warmup_steps < 1:
            raise ConfigError(f"TraceConfig.warmup_steps must be >= 1, got {self.warmup_steps}")


class _Open:
    __slots__ = ("cut_on_use", "label", "param_set", "params", "phase")

    def __init__(self, label: str, phase: str, params: Sequence[str], cut_on_use: bool):
        self.label, self.phase, self.cut_on_use = label, phase, cut_on_use
        self.params = list(params)
        self.param_set = set(params)


class HookTracer:
    """Traces warmup steps of ``model`` (and ``optimizer``), then freezes ``stats``.

        tracer = HookTracer(model, optimizer=opt)
        for batch in data:
            with tracer.step():      # traced during warmup, a no-op afterwards
                model(batch).sum().backward(); opt.step(); opt.zero_grad()
        stats = tracer.stats         # MemStats

    ``sources`` are ``ModelDataSource``s; see [Note: model data].
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        optimizer: torch.optim.Optimizer | None = None,
        sources: Sequence[ModelDataSource] = (),
        config: TraceConfig | None = None,
    ):
        self.model = model
        self.optimizer = optimizer
        self.sources = list(sources)
        for s in self.sources:
            if not isinstance(s, ModelDataSource):
                raise ConfigError(
                    f"{type(s).__name__} is not a ModelDataSource: give it a method "
                    "model_data_bytes(tier) -> int"
                )
        self.config = config or TraceConfig()
        dev = self.config.compute_device
        if dev is None:
            first = next(iter(model.parameters()), None)
            dev = str(first.device) if first is not None else "cpu"
        self.compute_device = torch.device(dev)
        self._steps: list[list[Moment]] = []
        self._summaries: list[StepSummary] = []
        self._stats: MemStats | None = None
        self._tracker: LiveTensorTracker | None = None
        self._moments: list[Moment] = []
        self._cur: _Open | None = None
        self._handles: list[Any] = []

    # -- public -----------------------------------------------------------------------------
    @property
    def phase(self) -> str:
        """``warmup`` while steps are traced, ``steady`` once the statistics are frozen."""
        return "steady" if self._stats is not None else "warmup"

    @property
    def stats(self) -> MemStats:
        """The frozen statistics (or, during warmup, those of the steps traced so far)."""
        if self._stats is not None:
            return self._stats
        if not self._steps:
            raise ConfigError("no step has been traced yet: run one inside `with tracer.step():`")
        return self._merge()

    @property
    def tracker(self) -> LiveTensorTracker | None:
        """The live-tensor tracker of the step being traced (None outside a traced step)."""
        return self._tracker

    def mark(self, label: str, phase: str = "other") -> None:
        """Open a moment by hand (e.g. ``"loss"``); ignored outside a traced step."""
        if self._tracker is not None:
            self._begin(label, phase, ())

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        """Trace one training step during warmup; run it untouched once frozen."""
        if self._stats is not None:
            yield
            return
        tracker = self._start()
        try:
            with tracker:
                yield
        finally:
            self._finish()

    # -- the traced step --------------------------------------------------------------------
    def _model_bytes_fn(self, tier: TierName) -> int:
        tiers = [tier]
        if tier is TierName.ACCELERATOR and self.compute_device.type in ("cpu", "meta"):
            tiers.append(TierName.HOST)  # emulated: host chunks are CPU storages too
        return sum(s.model_data_bytes(t) for s in self.sources for t in tiers)

    def _start(self) -> LiveTensorTracker:
        tracker = LiveTensorTracker(
            self.compute_device, model_bytes_fn=self._model_bytes_fn if self.sources else None
        )
        named = list(self.model.named_parameters())
        tracker.watch_parameters(named)
        tracker.on_param_use = self._on_param_use
        tracker.track((p for _, p in named), model=True)
        tracker.track((p.grad for _, p in named if p.grad is not None), model=True)
        tracker.track(self.model.buffers())
        self._track_optimizer_states(tracker)
        tracker.cut()
        self._tracker = tracker
        self._moments = []
        self._cur = _Open("start", "other", (), True)
        self._install_hooks(named)
        return tracker

    def _track_optimizer_states(self, tracker: LiveTensorTracker) -> None:
        if self.optimizer is None:
            return
        for state in self.optimizer.state.values():
            tracker.track((v for v in state.values() if isinstance(v, torch.Tensor)), model=True)

    def _install_hooks(self, named: list[tuple[str, nn.Parameter]]) -> None:
        h = self._handles
        for mod_name, module in self.model.named_modules():
            # What module.named_parameters(recurse=False) yields (None and repeats skipped),
            # read from the registry directly: this runs every traced step.
            seen: set[int] = set()
            own = tuple(
                f"{mod_name}.{n}" if mod_name else n
                for n, p in module._parameters.items()
                if p is not None and not (id(p) in seen or seen.add(id(p)))
            )
            if not own:
                continue
            label = mod_name or type(module).__name__
            h.append(module.register_forward_pre_hook(self._fwd_pre(label, own)))
            h.append(module.register_forward_hook(self._fwd_post(label, own)))
        for _, p in named:
            if p.requires_grad:
                h.append(p.register_post_accumulate_grad_hook(self._grad_ready))
        if self.optimizer is not None:
            h.append(self.optimizer.register_step_pre_hook(self._opt_pre))
            h.append(self.optimizer.register_step_post_hook(self._opt_post))

    def _fwd_pre(self, label: str, own: tuple[str, ...]) -> Any:
        fwd, again = f"fwd:{label}", f"recompute:{label}"

        def hook(module: nn.Module, args: Any) -> None:
            if torch._C._current_autograd_node() is None:
                self._begin(fwd, "forward", own)
            else:  # a checkpointed region recomputed in backward
                self._begin(again, "backward", own)

        return hook

    def _fwd_post(self, label: str, own: tuple[str, ...]) -> Any:
        label = f"bwd:{label}"

        def on_grad(grad: torch.Tensor) -> None:
            if self._tracker is not None:
                self._begin(label, "backward", own)

        def hook(module: nn.Module, args: Any, output: Any) -> None:
            outs = (output,) if isinstance(output, torch.Tensor) else tree_flatten(output)[0]
            for t in outs:
                if isinstance(t, torch.Tensor) and t.requires_grad:
                    t.register_hook(on_grad)
                    break

        return hook

    def _grad_ready(self, p: torch.Tensor) -> None:
        if self._tracker is not None and p.grad is not None:
            self._tracker.mark_model(p.grad)

    def _opt_pre(self, *_: Any) -> None:
        if self._tracker is not None:
            self._begin("optimizer", "optimizer", (), cut_on_use=False)

    def _opt_post(self, *_: Any) -> None:
        # States created inside step() were counted as non-model while it ran; count them as model
        # data from their creation (torch's optimizers create state before their temporaries, so
        # taking their bytes off the moment's non-model peak is exact for them).
        tracker = self._tracker
        if tracker is None:
            return
        before = {
            t: tracker.used_bytes(t, model=True) for t in (TierName.ACCELERATOR, TierName.HOST)
        }
        self._track_optimizer_states(tracker)
        for tier, old in before.items():
            tracker.discount_window(tier, tracker.used_bytes(tier, model=True) - old)

    def _on_param_use(self, name: str) -> None:
        cur = self._cur
        if cur is None or name in cur.param_set:
            return
        if cur.cut_on_use and self.config.cut_on_param_use:
            in_bwd = torch._C._current_autograd_node() is not None
            self._begin(f"use:{name}", "backward" if in_bwd else "forward", (name,))
        else:
            cur.params.append(name)
            cur.param_set.add(name)

    def _begin(
        self, label: str, phase: str, params: Sequence[str], *, cut_on_use: bool = True
    ) -> None:
        self._close_moment()
        self._cur = _Open(label, phase, params, cut_on_use)

    def _close_moment(self) -> None:
        assert self._tracker is not None and self._cur is not None  # only called while tracing
        win = self._tracker.cut()
        cur = self._cur
        self._moments.append(
            Moment(
                index=len(self._moments),
                label=cur.label,
                phase=cur.phase,
                params=tuple(cur.params),
                model_bytes=self._model_bytes(win),
                non_model_peak={t.value: w.non_model for t, w in win.items()},
                total_peak={t.value: w.total for t, w in win.items()},
            )
        )

    def _model_bytes(self, win: dict[TierName, WindowPeak]) -> dict[str, int]:
        if not self.sources:
            return {t.value: w.model_at_end for t, w in win.items()}
        return {t.value: sum(s.model_data_bytes(t) for s in self.sources) for t in TierName}

    def _finish(self) -> None:
        try:
            self._close_moment()
        finally:
            for handle in self._handles:
                handle.remove()
            self._handles = []
            assert self._tracker is not None
            self._tracker.close()
            self._tracker = None
            self._cur = None
        moments, self._moments = self._moments, []
        tiers = {k for m in moments for k in m.total_peak}
        self._summaries.append(
            StepSummary(
                step=len(self._steps),
                num_moments=len(moments),
                peak_total={t: max(m.total_peak.get(t, 0) for m in moments) for t in tiers},
                peak_non_model={t: max(m.non_model_peak.get(t, 0) for m in moments) for t in tiers},
                model_bytes_end=dict(moments[-1].model_bytes),
            )
        )
        self._steps.append(moments)
        if len(self._steps) >= self.config.warmup_steps:
            self._stats = self._merge()

    def _merge(self) -> MemStats:
        last = self._steps[-1]
        extra: dict[str, Any] = {"warmup_steps": len(self._steps)}
        same = all([m.label for m in s] == [m.label for m in last] for s in self._steps)
        if len(self._steps) == 1:  # nothing to take the maximum over
            moments = tuple(last)
        elif same:
            moments = tuple(
                Moment(
                    index=m.index,
                    label=m.label,
                    phase=m.phase,
                    params=m.params,
                    model_bytes=m.model_bytes,
                    non_model_peak=_max_maps(s[m.index].non_model_peak for s in self._steps),
                    total_peak=_max_maps(s[m.index].total_peak for s in self._steps),
                )
                for m in last
            )
        else:  # steps cut differently (data-dependent control flow): keep the last one
            moments = tuple(last)
            extra["warmup_steps_differ"] = True
        return MemStats(
            moments=moments,
            steps=tuple(self._summaries),
            device=str(self.compute_device),
            emulated=self.compute_device.type in ("cpu", "meta"),
            source="live-tensors",
            model_data=",".join(type(s).__name__ for s in self.sources) or "tracked",
            extra=extra,
        )


def _max_maps(maps: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for m in maps:
        for k, v in m.items():
            out[k] = max(out.get(k, 0), int(v))
    return out
