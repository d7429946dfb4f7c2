"""What ``colossal train`` runs: a ``TrainConfig`` of frozen sections, validated once.

The command line's flags enter through ``TrainConfig.from_flags`` ([Note: flags] in
``_sections``); sizes are parsed there, once ([Note: budgets]). Each section checks its own
settings; what involves several of them (which plugin runs, what it builds, which flags apply
to it) is checked here, in ``__post_init__``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from colossal_contracts import ConfigError
from colossal_parallel import TP_MODES
from colossal_parallel.pipeline import SCHEDULES

from .._sizes import parse_bytes
from ._lora_flags import check_lora_flags
from ._mesh import check_flags, resolve_plugin
from ._sections import (
    FLAGS,
    SECTIONS,
    CheckpointSection,
    DataSection,
    LoggingSection,
    MemorySection,
    ModelSection,
    ParallelSection,
    TrainingSection,
)

__all__ = ["EXPORTS", "TrainConfig"]

EXPORTS = ("final", "every", "none", "merged")
_BUDGETS = ("accelerator_budget", "host_budget", "disk_budget")


@dataclass(frozen=True)
class TrainConfig:
    """A training run, in sections (see each section's attributes).

    Build one from ``colossal train``'s flags with ``TrainConfig.from_flags(steps=20, tp=2,
    accelerator_budget="512MiB")``; ``cfg.flags()`` gives them back (budgets in bytes) and
    ``cfg.replace(steps=40)`` is the same run with some flags changed. After construction
    ``parallel.plugin`` and ``parallel.zero`` name what runs ([Note: choosing the plugin]).

    Attributes:
        model: what is trained (family or Hugging Face folder, size, dropout, LoRA).
        data: what it reads (dataset, tokenizer, batch size, sequence length).
        training: how long and how it learns (steps, seed, learning rate, clipping,
            accumulation), as torchtitan's ``training`` section.
        parallel: how it is split over ranks (plugin, ZeRO stage, tp, sp, pp).
        memory: where its states live (placement, precision, tier budgets).
        checkpoint: where it writes and what it saves (out, interval, export, resume).
        logging: what it reports (progress, evaluation, TensorBoard).
    """

    model: ModelSection = field(default_factory=ModelSection)
    data: DataSection = field(default_factory=DataSection)
    training: TrainingSection = field(default_factory=TrainingSection)
    parallel: ParallelSection = field(default_factory=ParallelSection)
    memory: MemorySection = field(default_factory=MemorySection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    logging: LoggingSection = field(default_factory=LoggingSection)

    @classmethod
    def from_flags(cls, **flags: Any) -> TrainConfig:
        """The run ``colossal train``'s flags describe (names as in ``FLAGS``: ``tp_mode`` for
        ``--tp-mode``; ``corpus`` is the older name of ``data``; budgets as sizes such as
        "512MiB" or ints of bytes). Unknown names and bad values are one-line ``ConfigError``s."""
        unknown = sorted(set(flags) - set(FLAGS) - {"corpus"})
        if unknown:
            raise ConfigError(
                f"unknown TrainConfig setting(s) {', '.join(unknown)}; the settings are the "
                "flags of colossal train, e.g. steps, tp_mode, accelerator_budget"
            )
        _merge_corpus(flags)
        for name in _BUDGETS:
            if name in flags:
                flags[name] = parse_bytes(flags[name], what="--" + name.replace("_", "-"))
        kw: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
        for flag, value in flags.items():
            section, name = FLAGS[flag]
            kw[section][name] = value
        sections: dict[str, Any] = {name: SECTIONS[name](**kw[name]) for name in SECTIONS}
        return cls(**sections)

    def flags(self) -> dict[str, Any]:
        """Every flag's value, keyed as ``from_flags`` takes them (budgets in bytes)."""
        return {flag: getattr(getattr(self, s), name) for flag, (s, name) in FLAGS.items()}

    def replace(self, **flags: Any) -> TrainConfig:
        """This run with ``flags`` changed, validated again."""
        return TrainConfig.from_flags(**{**self.flags(), **flags})

    def exports_at(self, step: int) -> bool:
        """Whether the checkpoint saved after ``step`` carries the consolidated model."""
        export = self.checkpoint.export
        final = export in ("final", "merged")
        return export == "every" or (final and step == self.training.steps)

    def __post_init__(self) -> None:
        for name, kind in SECTIONS.items():
            if not isinstance(getattr(self, name), kind):
                raise ConfigError(
                    f"TrainConfig.{name} must be a {kind.__name__}, got "
                    f"{type(getattr(self, name)).__name__}; build a run from flags with "
                    "TrainConfig.from_flags(...)"
                )
        self._check_values()
        par = self.parallel
        plugin, zero = resolve_plugin(self)  # see [Note: choosing the plugin]
        stage = zero if plugin == "zero" else par.zero_stage
        par = dataclasses.replace(par, plugin=plugin, zero=zero, zero_stage=stage)
        object.__setattr__(self, "parallel", par)
        check_flags(self, zero)  # the capability table ([Note: capability table])
        if self.logging.log not in (None, "tensorboard"):
            raise ConfigError(f"unknown --log {self.logging.log!r}; the one choice is: tensorboard")
        if self.checkpoint.export == "every" and plugin in ("ddp", "hybrid"):
            raise ConfigError(
                f"--export every applies to the gemini and zero plugins, not {plugin} (ddp "
                "checkpoints are the full model; hybrid ones export with colossal.export_checkpoint"
                "); drop it"
            )
        if not self.checkpoint.save_final and self.checkpoint.export in ("final", "merged"):
            raise ConfigError(
                f"--no-final-save leaves no final checkpoint for --export "
                f"{self.checkpoint.export}; add --export none (or drop --no-final-save)"
            )
        if self.training.max_grad_norm and plugin == "ddp":
            raise ConfigError(
                "--max-grad-norm is not built for --plugin ddp; use --zero 1 or drop it"
            )
        name = self.model.name
        if name not in ("gpt", "palm") and not name.startswith("hf:"):
            raise ConfigError(
                f"unknown --model {name!r}; choose one of: gpt, palm, hf:PATH (a local "
                "Hugging Face config.json or saved folder)"
            )
        self._check_tiers()
        check_lora_flags(self)
        if plugin == "zero" or par.zero_stage != 1:
            self._check_zero()
        if plugin in ("ddp", "hybrid"):
            given = _gemini_flags(self.memory, precision=plugin == "ddp")
            if given:
                raise ConfigError(
                    f"{', '.join(given)} applies to --plugin gemini only, not {plugin}; drop "
                    "it or use --plugin gemini"
                )

    def _check_values(self) -> None:
        """Ranges and choices of single settings that the sections' types do not say."""
        t, m = self.training, self.memory
        val, dropout = self.data.val_fraction, self.model.dropout
        if not (math.isfinite(val) and 0 <= val < 1):
            raise ConfigError(f"--val-fraction must be in [0, 1), got {val}")
        if dropout is not None:
            if not (math.isfinite(dropout) and 0 <= dropout < 1):
                raise ConfigError(f"--dropout must be in [0, 1), got {dropout}")
            if self.model.name != "gpt":
                raise ConfigError(
                    f"--dropout applies to --model gpt, not {self.model.name} (a Hugging Face "
                    "model keeps its config.json's dropout); drop it"
                )
        if not (math.isfinite(t.lr) and 0 < t.lr <= 10):
            raise ConfigError(f"--lr must be positive and at most 10 (try 1e-3), got {t.lr}")
        if not (math.isfinite(t.weight_decay) and t.weight_decay >= 0):
            raise ConfigError(f"weight_decay must be finite and >= 0, got {t.weight_decay}")
        _choose("--placement", m.placement, ("auto", "static"))
        _choose("--states-placement", m.states_placement, ("free", "demand", "host"))
        _choose("--precision", m.precision, ("fp32", "bf16", "fp16"))
        if not (math.isfinite(t.max_grad_norm) and t.max_grad_norm >= 0):
            raise ConfigError(f"--max-grad-norm must be finite and >= 0, got {t.max_grad_norm}")
        _choose("--tp-mode", self.parallel.tp_mode, TP_MODES)
        _choose("--export", self.checkpoint.export, EXPORTS)
        _choose("--schedule", self.parallel.schedule, SCHEDULES)

    def _check_tiers(self) -> None:
        """Host and disk budgets (Gemini only); the disk directory is checked before anything
        runs or is written. [Note: budgets]: 0 is no disk tier; the job needs a number."""
        from colossal_zero import check_disk_dir

        m = self.memory
        given = [
            f"--{flag.replace('_', '-')} {value}"
            for flag, value, unset in (
                ("host_budget", m.host_bytes, None),
                ("disk_budget", m.disk_bytes, 0),
                ("disk_dir", m.disk_dir, None),
            )
            if value != unset
        ]
        if given and self.parallel.plugin != "gemini":
            raise ConfigError(
                f"{', '.join(given)} applies to --plugin gemini only, not "
                f"{self.parallel.plugin}; drop it or use --plugin gemini"
            )
        if m.disk_bytes is None:
            raise ConfigError(
                "--disk-budget needs a size (say, --disk-budget 64GiB): the job checks the disk "
                "directory's free space and the tiers' room against it; 0 is no disk tier"
            )
        if m.disk_dir is not None and m.disk_bytes == 0:
            raise ConfigError("--disk-dir needs --disk-budget (say, --disk-budget 64GiB)")
        if m.disk_bytes:
            check_disk_dir(m.disk_dir, m.disk_bytes)

    def _check_zero(self) -> None:
        from colossal_zero import ZeroConfig  # its stage check: one message for stage 3

        if self.parallel.plugin != "zero":
            raise ConfigError(
                f"--zero-stage applies to --plugin zero only, not {self.parallel.plugin}; drop "
                "it or use --plugin zero"
            )
        ZeroConfig(stage=self.parallel.zero_stage)
        given = _gemini_flags(self.memory, precision=False)
        if given:
            raise ConfigError(
                f"{', '.join(given)} applies to --plugin gemini only, not zero; drop it or use "
                "--plugin gemini"
            )


def _merge_corpus(flags: dict[str, Any]) -> None:
    """``corpus`` as the older name of ``data``: one path in ``flags["data"]``."""
    if "corpus" not in flags:
        return
    corpus = flags.pop("corpus")
    if corpus is not None and not isinstance(corpus, str | Path):
        raise ConfigError(
            f"TrainConfig.corpus must be Path or str or NoneType, got {type(corpus).__name__} "
            f"{corpus!r}"
        )
    if corpus == "":
        raise ConfigError("--corpus is empty; give a path (use . for this folder)")
    data = flags.get("data")
    if corpus is not None and data not in (None, "") and Path(data) != Path(corpus):
        raise ConfigError(
            f"--data {data} and --corpus {corpus} disagree; --corpus is the older name of "
            "--data: give one"
        )
    if data is None:
        flags["data"] = corpus


def _choose(flag: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"unknown {flag} {value!r}; choose one of: {', '.join(choices)}")


def _gemini_flags(m: MemorySection, *, precision: bool) -> list[str]:
    """Gemini's flags given away from their defaults (``precision``: that one too)."""
    given = [("placement", m.placement, "auto"), ("accelerator_budget", m.accelerator_bytes, None)]
    given.append(("states_placement", m.states_placement, "free"))
    if precision:
        given.append(("precision", m.precision, "fp32"))
    return [f"--{k.replace('_', '-')} {v}" for k, v, default in given if v != default]
