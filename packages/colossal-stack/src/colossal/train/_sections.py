"""The sections of a ``TrainConfig`` (as torchtitan's ``JobConfig``): what the model is, what it
reads, how long and how it learns, how it is split over ranks, where its states live, what it
saves and what it reports. Each section is frozen and checks its own settings when built (types
and ranges, messages naming the ``colossal train`` flag); what involves several sections is
``TrainConfig``'s.

[Note: flags] ``FLAGS`` maps each ``colossal train`` flag (``--tp-mode`` -> ``tp_mode``) to
the one field that holds it, ``(section, field)``. A field keeps its flag's name except where
the section says it already (``model.name`` for ``--model``, ``data.path`` for ``--data``,
``checkpoint.every`` for ``--checkpoint-every``) and the budgets, which are parsed into
``memory.accelerator_bytes`` and friends ([Note: budgets] in ``colossal._sizes``).
``TrainConfig.from_flags`` and ``TrainConfig.flags`` go through this one table.
"""

from __future__ import annotations

from dataclasses import Field, dataclass, fields
from pathlib import Path
from typing import Any, ClassVar

from colossal_contracts import ConfigError
from colossal_parallel import TpMode
from colossal_parallel.pipeline import ScheduleKind

__all__ = [
    "FLAGS",
    "CheckpointSection",
    "DataSection",
    "LoggingSection",
    "MemorySection",
    "ModelSection",
    "ParallelSection",
    "TrainingSection",
]

_NONE = type(None)
# flag -> (types it takes, (lowest, highest) for an integer setting or None)
_CHECKS: dict[str, tuple[tuple[type, ...], tuple[int, int] | None]] = {
    "model": ((str,), None),
    "preset": ((str,), None),
    "dropout": ((float, int, _NONE), None),
    "activation_checkpointing": ((bool,), None),
    "lora_rank": ((int, _NONE), None),
    "lora_alpha": ((float, int, _NONE), None),
    "lora_targets": ((str,), None),
    "lora_dropout": ((float, int), None),
    "data": ((Path, str, _NONE), None),
    "tokenizer": ((str, _NONE), None),
    "text_field": ((str,), None),
    "val_fraction": ((float, int), None),
    "batch_size": ((int,), (1, 2**16)),
    "seq_len": ((int,), (1, 2**20)),
    "steps": ((int,), (1, 2**24 - 1)),
    "seed": ((int,), (0, 2**23 - 1)),
    "lr": ((float, int), None),
    "weight_decay": ((float, int), None),
    "max_grad_norm": ((float, int), None),
    "grad_accum": ((int,), (1, 2**16)),
    "plugin": ((str, _NONE), None),
    "zero": ((int, _NONE), None),
    "zero_stage": ((int,), None),
    "tp": ((int,), (1, 2**12)),
    "tp_mode": ((str,), None),
    "tp_depth": ((int,), (1, 2**12)),
    "sp": ((str, _NONE), None),
    "sp_size": ((int,), (1, 2**12)),
    "pp": ((int,), (1, 2**12)),
    "microbatches": ((int,), (1, 2**16)),
    "schedule": ((str,), None),
    "layout": ((str, _NONE), None),
    "placement": ((str,), None),
    "states_placement": ((str,), None),
    "precision": ((str,), None),
    "accelerator_budget": ((int, _NONE), None),
    "host_budget": ((int, _NONE), None),
    "disk_budget": ((int, _NONE), None),
    "disk_dir": ((Path, str, _NONE), None),
    "out": ((Path, str), None),
    "checkpoint_every": ((int,), (0, 2**24 - 1)),
    "save_final": ((bool,), None),
    "export": ((str,), None),
    "resume": ((bool,), None),
    "restart": ((bool,), None),
    "log_every": ((int,), (1, 2**24 - 1)),
    "eval_every": ((int,), (0, 2**24 - 1)),
    "log": ((str, _NONE), None),
}
_PATHS = ("data", "disk_dir", "out")


class _Section:
    """Checks every field of a section by its flag's entry in ``_CHECKS``; str paths become
    ``Path``s."""

    _SECTION = ""
    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]  # every section is a dataclass

    def __post_init__(self) -> None:
        for f in fields(self):
            flag = _FLAG_OF[(self._SECTION, f.name)]
            value = getattr(self, f.name)
            kinds, bounds = _CHECKS[flag]
            if not isinstance(value, kinds) or isinstance(value, bool) != (kinds == (bool,)):
                want = " or ".join(k.__name__ for k in kinds)
                raise ConfigError(
                    f"TrainConfig.{flag} must be {want}, got {type(value).__name__} {value!r}"
                )
            if flag in _PATHS and value is not None:
                if value == "":
                    raise ConfigError(
                        f"--{flag.replace('_', '-')} is empty; give a path (use . for this folder)"
                    )
                object.__setattr__(self, f.name, Path(value))
            if bounds is not None and not bounds[0] <= value <= bounds[1]:
                lo, hi = bounds
                name = "--" + flag.replace("_", "-")
                if lo == 1 and value < 1:
                    raise ConfigError(f"{name} must be positive, got {value}")
                raise ConfigError(f"{name} must be in [{lo}, {hi}], got {value}")


@dataclass(frozen=True)
class ModelSection(_Section):
    """What is trained.

    Attributes:
        name: model family ("gpt" or "palm"), or "hf:PATH": a Hugging Face causal LM from a
            local config.json or saved folder (``preset`` then does not apply). ``--model``.
        preset: named size of that family (``GPTConfig.preset``, ``PaLMConfig.preset``); vocab is
            the tokenizer's.
        dropout: dropout probability of ``--model gpt`` (None: the preset's, 0); resumes are
            exact with it on (the checkpoint keeps every rank's RNG states).
        activation_checkpointing: recompute each block's activations in backward (every
            plugin; a Hugging Face model through its own ``gradient_checkpointing_enable``).
        lora_rank: train LoRA adapters of this rank through ``peft`` on a frozen base (None:
            full fine-tuning); see ``colossal.lora``. The run's export is then a PEFT adapter
            folder (``out/adapter``), and with ``export="merged"`` also the merged model.
        lora_alpha: LoRA's scaling numerator (updates scaled by alpha / rank); None: the rank.
        lora_targets: comma list of "attn", "mlp" and module names ([Note: LoRA targets]).
        lora_dropout: dropout on the adapters' input.
    """

    _SECTION = "model"
    name: str = "gpt"
    preset: str = "tiny"
    dropout: float | None = None
    activation_checkpointing: bool = False
    lora_rank: int | None = None
    lora_alpha: float | None = None
    lora_targets: str = "attn,mlp"
    lora_dropout: float = 0.0


@dataclass(frozen=True)
class DataSection(_Section):
    """What the model reads.

    Attributes:
        path: text file or folder, .jsonl, .parquet, a saved Hugging Face dataset folder, or a
            folder made by ``colossal data prepare``; None is the embedded default (the first 16
            MiB of Python's standard library). See docs/data.md. ``--data`` (or ``--corpus``).
        tokenizer: "bytes" or "hf:PATH" (a tokenizer.json or a folder holding one); None: a
            prepared folder's own, else the ``hf:`` model folder's, else "bytes".
        text_field: the jsonl key / parquet or dataset column holding the text.
        val_fraction: documents held out for validation (the last ones; 0: no validation).
        batch_size: sequences per step on each data-parallel rank (global batch = batch_size *
            dp; every rank of one dp coordinate gets the same batch, see [Note: mesh data]).
        seq_len: tokens per sequence.
    """

    _SECTION = "data"
    path: Path | None = None
    tokenizer: str | None = None
    text_field: str = "text"
    val_fraction: float = 0.05
    batch_size: int = 16
    seq_len: int = 128


@dataclass(frozen=True)
class TrainingSection(_Section):
    """How long and how the model learns (AdamW, betas 0.9/0.95).

    Attributes:
        steps: optimizer steps.
        seed: seeds model init (same on every rank) and data (offset per rank).
        lr: peak learning rate (linear warmup over 10% of steps, cosine decay to 10% of it).
        weight_decay: AdamW decay of matrices (embeddings and Linear weights); biases and norm
            weights are not decayed (the nanoGPT / Hugging Face convention), under every plugin.
        max_grad_norm: clip the global gradient norm, over the whole mesh (0: off).
        grad_accum: micro-batches of ``batch_size`` sequences accumulated into one optimizer
            step (a step sees ``batch_size * grad_accum`` sequences per data-parallel rank and
            equals one batch of that size); pipelined runs take them as more micro-batches.
    """

    _SECTION = "training"
    steps: int = 200
    seed: int = 0
    lr: float = 2e-3
    weight_decay: float = 0.1
    max_grad_norm: float = 0.0
    grad_accum: int = 1


@dataclass(frozen=True)
class ParallelSection(_Section):
    """How the run is split over ranks ([Note: choosing the plugin]).

    Attributes:
        plugin: training strategy ("gemini": ZeRO-3 over chunks under a memory budget, "zero":
            ZeRO stage 1 or 2 with replicated parameters, "ddp", or "hybrid": tensor, pipeline
            and sequence parallelism with ZeRO 0-2); None: chosen from ``zero`` and the mesh
            flags, so in a ``TrainConfig`` it is always a name.
        zero: the ZeRO stage 0-3 (None: the plugin's own); in a ``TrainConfig`` the stage the run
            uses (ddp 0, gemini 3).
        zero_stage: ZeRO stage of ``plugin="zero"``: 1 or 2; the older spelling of ``zero``.
        tp: tensor-parallel ranks; tp_mode "1d", "2d" (tp = q*q), "2.5d" (q*q*tp_depth), "3d".
        tp_depth: the depth d of 2.5d tensor parallelism.
        sp: sequence parallelism: "ring" or "ulysses" over ``sp_size`` ranks of their own,
            "megatron" (activations split over the 1d tp ranks), or both ("ring+megatron",
            "ulysses+megatron"); None: off.
        sp_size: ranks each sequence is split over (ring, ulysses).
        pp: pipeline stages; microbatches per step; schedule "1f1b", "interleaved" (two chunks
            per rank) or "gpipe".
        layout: the ``colossal plan`` layout the mesh flags came from (``--layout``), recorded
            in metrics.jsonl and the summary; None: flags given one by one.

    ``tp``, ``tp_mode``, ``tp_depth``, ``sp`` and ``sp_size`` are the plugins' mesh fields
    under their flags' names; ``mesh_fields`` gives them under the plugins' names.
    """

    _SECTION = "parallel"
    plugin: str | None = None
    zero: int | None = None
    zero_stage: int = 1
    tp: int = 1
    tp_mode: TpMode = "1d"
    tp_depth: int = 1
    sp: str | None = None
    sp_size: int = 1
    pp: int = 1
    microbatches: int = 1
    schedule: ScheduleKind = "1f1b"
    layout: str | None = None

    def mesh_fields(self) -> dict[str, Any]:
        """The tensor- and sequence-parallel settings as the hybrid and Gemini plugins take
        them (``colossal.booster``'s [Note: mesh fields]): ``--tp`` is ``tp_size``, ``--sp``
        ``sequence_parallel``."""
        return {
            "tp_size": self.tp,
            "tp_mode": self.tp_mode,
            "tp_depth": self.tp_depth,
            "sequence_parallel": self.sp,
            "sp_size": self.sp_size,
        }


@dataclass(frozen=True)
class MemorySection(_Section):
    """Where the model states live (Gemini's settings; ``precision`` ZeRO's too). Budgets are
    ints of bytes, None and 0 as [Note: budgets] says.

    Attributes:
        placement: Gemini chunk placement, "auto" (traced, Belady eviction) or "static".
        precision: Gemini's or ZeRO's training precision: "fp32", "bf16" or "fp16" (fp32 masters).
        accelerator_bytes: chunks on the accelerator (``--accelerator-budget``); None: all of it
            (on an emulated accelerator: no limit).
        host_bytes: chunks in host memory (``--host-budget``); None: no limit.
        disk_bytes: chunks on disk, used when the host budget is full: fp32 masters, Adam
            states, cold parameter chunks (``--disk-budget``); 0: no disk tier. The job needs a
            number (None, a disk tier without a limit, is refused).
        disk_dir: directory of the disk tier (must exist, be writable and have ``disk_bytes``
            free); None: the system's temporary directory.
        states_placement: where Gemini's Adam states (and fp32 masters) live once the first
            step is measured: "free" (to the accelerator into room no moment used), "demand"
            (also into room cached chunks filled) or "host" (where they started: the host,
            spilling to disk). ``colossal_zero.GeminiConfig.states_placement``.
    """

    _SECTION = "memory"
    placement: str = "auto"
    precision: str = "fp32"
    accelerator_bytes: int | None = None
    host_bytes: int | None = None
    disk_bytes: int | None = 0
    disk_dir: Path | None = None
    states_placement: str = "free"


@dataclass(frozen=True)
class CheckpointSection(_Section):
    """Where the run writes and what it saves.

    Attributes:
        out: directory for metrics.jsonl, the checkpoint and plots.
        every: save every N steps (0: only at the end). ``--checkpoint-every``.
        save_final: save a checkpoint when the run ends; False (``--no-final-save``): only the
            ``every`` saves (a run whose disk tier fills the disk); export not final.
        export: which checkpoints also carry the consolidated fp32 model (bounded safetensors
            shards with a Hugging Face ``model.safetensors.index.json``) beside the sharded
            training state, for the gemini and zero plugins: "final" (the last step's only),
            "every" or "none" (export later with ``colossal.export_checkpoint``); "merged": a
            LoRA run's merged model too. Unless "none", an ``hf:`` run also leaves ``out/hf``.
        resume: continue from the checkpoint under ``out`` (``out/checkpoint/latest``).
        restart: move a run already in ``out`` aside (to ``<out>.old-<k>``) and start afresh.
    """

    _SECTION = "checkpoint"
    out: Path = Path("runs/latest")
    every: int = 0
    save_final: bool = True
    export: str = "final"
    resume: bool = False
    restart: bool = False


@dataclass(frozen=True)
class LoggingSection(_Section):
    """What the run reports.

    Attributes:
        log_every: refresh the progress display every N steps.
        eval_every: evaluate on held-out batches every N steps (``val_loss`` in the step's
            record; 0: only at the end).
        log: also log scalars to TensorBoard under ``out/tensorboard`` ("tensorboard", the
            optional extra ``tensorboard``); None: ``metrics.jsonl`` only.
    """

    _SECTION = "logging"
    log_every: int = 1
    eval_every: int = 0
    log: str | None = None


SECTIONS: dict[str, type[_Section]] = {
    "model": ModelSection,
    "data": DataSection,
    "training": TrainingSection,
    "parallel": ParallelSection,
    "memory": MemorySection,
    "checkpoint": CheckpointSection,
    "logging": LoggingSection,
}
_RENAMED = {
    "model": "name",
    "data": "path",
    "checkpoint_every": "every",
    "accelerator_budget": "accelerator_bytes",
    "host_budget": "host_bytes",
    "disk_budget": "disk_bytes",
}
FLAGS: dict[str, tuple[str, str]] = {}  # [Note: flags]
for _name, _cls in SECTIONS.items():
    _fields = {f.name for f in fields(_cls)}
    for _flag in _CHECKS:
        _field = _RENAMED.get(_flag, _flag)
        if _field in _fields:
            FLAGS[_flag] = (_name, _field)
_FLAG_OF = {where: flag for flag, where in FLAGS.items()}
assert len(FLAGS) == len(_CHECKS), sorted(set(_CHECKS) - set(FLAGS))


def flag_defaults() -> dict[str, Any]:
    """Every flag's default value (the sections' field defaults)."""
    out = {}
    for flag, (section, name) in FLAGS.items():
        f = next(f for f in fields(SECTIONS[section]) if f.name == name)
        out[flag] = f.default
    return out
