"""``MemStats``: what a traced step held in memory, moment by moment; satisfies ``MemStatsSource``."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from colossal_contracts import ConfigError, TierName

__all__ = ["MemStats", "Moment", "StepSummary"]

FORMAT_VERSION = 1


def _tier(tier: TierName | str) -> str:
    try:
        return TierName(tier).value
    except ValueError:
        names = ", ".join(t.value for t in TierName)
        raise ConfigError(f"unknown memory tier {tier!r}; use one of: {names}") from None


@dataclass(frozen=True)
class Moment:
    """One slice of a training step, from one boundary (hook or mark) to the next.

    Attributes:
        index: position in the step, from 0.
        label: what opened it: ``fwd:<module>``, ``bwd:<module>``, ``recompute:<module>`` (a
            checkpointed forward run again in backward), ``use:<parameter>`` (a parameter read
            outside its module, e.g. a tied head), ``optimizer``, ``start``.
        phase: ``forward``, ``backward``, ``optimizer`` or ``other``.
        params: parameter names (as in ``model.named_parameters()``) used, in order of use.
        model_bytes: tier -> model-data bytes when the moment ended.
        non_model_peak: tier -> highest non-model bytes during the moment.
        total_peak: tier -> highest total bytes (model + non-model) during the moment.
    """

    index: int
    label: str
    phase: str
    params: tuple[str, ...]
    model_bytes: Mapping[str, int]
    non_model_peak: Mapping[str, int]
    total_peak: Mapping[str, int]


@dataclass(frozen=True)
class StepSummary:
    """Per-step figures (one per traced step), bytes per tier.

    Attributes:
        step: index of the traced step, from 0.
        num_moments: moments the step was cut into.
        peak_total: highest total bytes during the step.
        peak_non_model: highest non-model bytes during the step.
        model_bytes_end: model-data bytes when the step ended.
    """

    step: int
    num_moments: int
    peak_total: Mapping[str, int]
    peak_non_model: Mapping[str, int]
    model_bytes_end: Mapping[str, int]


@dataclass(frozen=True)
class MemStats:
    """The result of tracing: per-moment model and non-model bytes, compute order, step summaries.

    Invariant: ``non_model_peak(i, t) <= total_peak`` of moment ``i`` on ``t``; moments are the
    warmup steps' (see ``HookTracer``): with several warmup steps of the same shape, each figure
    is the maximum over them.

    Attributes:
        moments: the moments of one step, in order.
        steps: one summary per traced step.
        device: the compute device the figures describe (``meta`` for a static estimate).
        emulated: True when the accelerator tier is emulated (compute on the CPU or on meta).
        source: how the bytes were measured (``live-tensors``, ``probes:<names>``,
            ``static-estimate``).
        model_data: where model data came from (``tracked`` params/grads/optimizer states, or
            the names of the registered model-data sources).
        extra: free-form facts (model name, batch shape, ...), kept through save/load.
    """

    moments: tuple[Moment, ...]
    steps: tuple[StepSummary, ...] = ()
    device: str = "cpu"
    emulated: bool = True
    source: str = "live-tensors"
    model_data: str = "tracked"
    extra: Mapping[str, Any] = field(default_factory=dict)

    # -- MemStatsSource ---------------------------------------------------------------------
    def num_moments(self) -> int:
        return len(self.moments)

    def _moment(self, moment: int) -> Moment:
        if not 0 <= moment < len(self.moments):
            raise ConfigError(
                f"moment {moment} is out of range: these stats have {len(self.moments)} moments "
                f"(0..{len(self.moments) - 1})"
            )
        return self.moments[moment]

    def non_model_peak(self, moment: int, tier: TierName | str) -> int:
        """Peak non-model bytes on ``tier`` during ``moment``; 0 for a tier nothing was seen on."""
        return int(self._moment(moment).non_model_peak.get(_tier(tier), 0))

    def compute_order(self) -> Sequence[tuple[str, ...]]:
        return [m.params for m in self.moments]

    # -- more -------------------------------------------------------------------------------
    def model_bytes(self, moment: int, tier: TierName | str) -> int:
        """Model-data bytes on ``tier`` at the end of ``moment``."""
        return int(self._moment(moment).model_bytes.get(_tier(tier), 0))

    def total_peak(self, moment: int, tier: TierName | str) -> int:
        return int(self._moment(moment).total_peak.get(_tier(tier), 0))

    def peak_bytes(self, tier: TierName | str = TierName.ACCELERATOR) -> int:
        """Highest total bytes on ``tier`` over the step."""
        t = _tier(tier)
        return max((int(m.total_peak.get(t, 0)) for m in self.moments), default=0)

    def peak_non_model(self, tier: TierName | str = TierName.ACCELERATOR) -> int:
        """Highest non-model bytes on ``tier`` over the step."""
        t = _tier(tier)
        return max((int(m.non_model_peak.get(t, 0)) for m in self.moments), default=0)

    def first_use(self) -> dict[str, int]:
        """Parameter name -> the first moment that used it."""
        out: dict[str, int] = {}
        for m in self.moments:
            for p in m.params:
                out.setdefault(p, m.index)
        return out

    def summary(self, tier: TierName | str = TierName.ACCELERATOR) -> dict[str, Any]:
        """Headline figures for ``tier``: peaks, model data, moments, per phase non-model peak."""
        t = _tier(tier)
        phases: dict[str, int] = {}
        for m in self.moments:
            phases[m.phase] = max(phases.get(m.phase, 0), int(m.non_model_peak.get(t, 0)))
        return {
            "tier": t,
            "num_moments": self.num_moments(),
            "peak_bytes": self.peak_bytes(t),
            "peak_non_model_bytes": self.peak_non_model(t),
            "model_bytes_end": self.model_bytes(len(self.moments) - 1, t) if self.moments else 0,
            "non_model_peak_by_phase": phases,
            "device": self.device,
            "emulated": self.emulated,
            "source": self.source,
        }

    # -- persistence ------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["format_version"] = FORMAT_VERSION
        for m in d["moments"]:
            m["params"] = list(m["params"])
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> MemStats:
        version = d.get("format_version")
        if version != FORMAT_VERSION:
            raise ConfigError(
                f"MemStats format_version {version!r} is not supported (this version reads "
                f"{FORMAT_VERSION}); re-run the trace with this colossal-memtrace"
            )
        try:
            moments = tuple(
                Moment(
                    index=int(m["index"]),
                    label=str(m["label"]),
                    phase=str(m["phase"]),
                    params=tuple(m["params"]),
                    model_bytes=dict(m["model_bytes"]),
                    non_model_peak=dict(m["non_model_peak"]),
                    total_peak=dict(m["total_peak"]),
                )
                for m in d["moments"]
            )
            steps = tuple(StepSummary(**s) for s in d.get("steps", ()))
        except (KeyError, TypeError) as exc:
            raise ConfigError(
                f"MemStats data is malformed ({exc!r}); was it written by save()?"
            ) from exc
        return cls(
            moments=moments,
            steps=steps,
            device=str(d.get("device", "cpu")),
            emulated=bool(d.get("emulated", True)),
            source=str(d.get("source", "live-tensors")),
            model_data=str(d.get("model_data", "tracked")),
            extra=dict(d.get("extra", {})),
        )

    def save(self, path: str | Path) -> Path:
        """Write JSON to ``path``; return it."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        return p

    @classmethod
    def load(cls, path: str | Path) -> MemStats:
        """Read what ``save`` wrote; ``ConfigError`` if it is not MemStats JSON."""
        p = Path(path)
        try:
            data = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(f"cannot read MemStats from {p}: {exc}") from exc
        return cls.from_dict(data)
