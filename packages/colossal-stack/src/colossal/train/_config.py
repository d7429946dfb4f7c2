"""What ``colossal train`` runs: one flat dataclass, validated once."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from colossal_contracts import ConfigError
from colossal_parallel import TP_MODES
from colossal_parallel.pipeline import SCHEDULES

from ._lora_flags import check_lora_flags
from ._mesh import check_flags, resolve_plugin

__all__ = ["EXPORTS", "TrainConfig"]

EXPORTS = ("final", "every", "none", "merged")


@dataclass(frozen=True)
class TrainConfig:
    """A training run.

    Attributes:
        model: model family ("gpt" or "palm"), or "hf:PATH": a Hugging Face causal LM from a
            local config.json or saved folder (``preset`` then does not apply).
        preset: named size of that family (``GPTConfig.preset``, ``PaLMConfig.preset``); vocab is
            the byte tokenizer's.
        steps: optimizer steps.
        batch_size: sequences per step on each data-parallel rank (global batch = batch_size *
            dp; every rank of one dp coordinate gets the same batch, see [Note: mesh data]).
        seq_len: tokens per sequence.
        seed: seeds model init (same on every rank) and data (offset per rank).
        data: text file or folder, .jsonl, .parquet, a saved Hugging Face dataset folder, or a
            folder made by ``colossal data prepare``; None is the embedded default (the first 16
            MiB of Python's standard library). See docs/data.md.
        corpus: the older name of ``data`` (after construction both hold the same path).
        tokenizer: "bytes" or "hf:PATH" (a tokenizer.json or a folder holding one); None: a
            prepared folder's own, else the ``hf:`` model folder's, else "bytes".
        text_field: the jsonl key / parquet or dataset column holding the text.
        val_fraction: documents held out for validation (the last ones; 0: no validation).
        dropout: dropout probability of ``--model gpt`` (None: the preset's, 0); resumes are
            exact with it on (the checkpoint keeps every rank's RNG states).
        out: directory for metrics.jsonl, the checkpoint and plots.
        plugin: training strategy ("gemini": ZeRO-3 over chunks under a memory budget, "zero":
            ZeRO stage 1 or 2 with replicated parameters, "ddp", or "hybrid": tensor, pipeline
            and sequence parallelism with ZeRO 0-2); None: chosen from ``zero`` and the mesh
            flags (see [Note: choosing the plugin]), so after construction it is always a name.
        placement: Gemini chunk placement, "auto" (traced, Belady eviction) or "static".
        accelerator_budget: Gemini's byte budget on the accelerator ("512MiB", "2GiB"); None: all
            of it (on an emulated accelerator: no limit).
        host_budget: Gemini's byte budget of chunks in host memory; None: no limit.
        disk_budget: Gemini's byte budget of chunks on disk, used when the host budget is full
            (fp32 masters, Adam states, cold parameter chunks); None: no disk tier.
        disk_dir: directory of the disk tier (must exist, be writable and have ``disk_budget``
            free); None: the system's temporary directory.
        precision: Gemini's or ZeRO's training precision: "fp32", "bf16" or "fp16" (fp32 masters).
        zero_stage: ZeRO stage of ``plugin="zero"``: 1 (optimizer states sharded) or 2 (gradients
            too); 3 is ``plugin="gemini"``. The older spelling of ``zero``.
        zero: the ZeRO stage 0-3 (None: the plugin's own); after construction the stage the run
            uses (ddp 0, gemini 3).
        tp: tensor-parallel ranks; tp_mode "1d", "2d" (tp = q*q), "2.5d" (q*q*tp_depth), "3d".
        tp_depth: the depth d of 2.5d tensor parallelism.
        sp: sequence parallelism: "ring" or "ulysses" over ``sp_size`` ranks of their own,
            "megatron" (activations split over the 1d tp ranks), or both ("ring+megatron",
            "ulysses+megatron"); None: off.
        sp_size: ranks each sequence is split over (ring, ulysses).
        pp: pipeline stages; microbatches per step; schedule "1f1b", "interleaved" (two chunks
            per rank) or "gpipe".
        activation_checkpointing: recompute each block's activations in backward (every
            plugin; a Hugging Face model through its own ``gradient_checkpointing_enable``).
        max_grad_norm: clip the global gradient norm, over the whole mesh (0: off).
        lr: peak learning rate (linear warmup over 10% of steps, cosine decay to 10% of it).
        weight_decay: AdamW decay of matrices (embeddings and Linear weights); biases and norm
            weights are not decayed (the nanoGPT / Hugging Face convention), under every plugin.
        grad_accum: micro-batches of ``batch_size`` sequences accumulated into one optimizer
            step (a step sees ``batch_size * grad_accum`` sequences per data-parallel rank and
            equals one batch of that size); pipelined runs take them as more micro-batches.
        eval_every: evaluate on held-out batches every N steps (``val_loss`` in the step's
            record; 0: only at the end).
        log: also log scalars to TensorBoard under ``out/tensorboard`` ("tensorboard", the
            optional extra ``tensorboard``); None: ``metrics.jsonl`` only.
        checkpoint_every: save every N steps (0: only at the end).
        save_final: save a checkpoint when the run ends; False (``--no-final-save``): only the
            ``checkpoint_every`` saves (a run whose disk tier fills the disk); export not final.
        export: which checkpoints also carry the consolidated fp32 model (bounded safetensors
            shards with a Hugging Face ``model.safetensors.index.json``) beside the sharded
            training state, for the gemini and zero plugins: "final" (the last step's only:
            intermediate saves write just the shards), "every" or "none" (export later with
            ``colossal.export_checkpoint``). ddp checkpoints are the full model already. Unless
            "none", an ``hf:`` run also leaves ``out/hf``: a Hugging Face folder of the final
            checkpoint (``colossal.export_hf``).
        resume: continue from the checkpoint under ``out`` (``out/checkpoint/latest``).
        restart: move a run already in ``out`` aside (to ``<out>.old-<k>``) and start afresh.
        log_every: refresh the progress display every N steps.
        layout: the ``colossal plan`` layout the mesh flags came from (``--layout``), recorded
            in metrics.jsonl and the summary; None: flags given one by one.
        lora_rank: train LoRA adapters of this rank through ``peft`` on a frozen base (None:
            full fine-tuning); see ``colossal.lora``. The run's export is then a PEFT adapter
            folder (``out/adapter``), and with ``export="merged"`` also the merged model as a
            Hugging Face folder (``out/hf``).
        lora_alpha: LoRA's scaling numerator (updates scaled by alpha / rank); None: the rank.
        lora_targets: comma list of "attn", "mlp" and module names ([Note: LoRA targets]).
        lora_dropout: dropout on the adapters' input.
    """

    model: str = "gpt"
    preset: str = "tiny"
    steps: int = 200
    batch_size: int = 16
    seq_len: int = 128
    seed: int = 0
    data: Path | None = None
    corpus: Path | None = None
    tokenizer: str | None = None
    text_field: str = "text"
    val_fraction: float = 0.05
    dropout: float | None = None
    out: Path = Path("runs/latest")
    plugin: str | None = None
    placement: str = "auto"
    accelerator_budget: str | None = None
    host_budget: str | None = None
    disk_budget: str | None = None
    disk_dir: Path | None = None
    precision: str = "fp32"
    zero_stage: int = 1
    lr: float = 2e-3
    weight_decay: float = 0.1
    checkpoint_every: int = 0
    save_final: bool = True
    export: str = "final"
    resume: bool = False
    restart: bool = False
    log_every: int = 1
    zero: int | None = None
    tp: int = 1
    tp_mode: str = "1d"
    tp_depth: int = 1
    sp: str | None = None
    sp_size: int = 1
    pp: int = 1
    microbatches: int = 1
    schedule: str = "1f1b"
    activation_checkpointing: bool = False
    max_grad_norm: float = 0.0
    layout: str | None = None
    grad_accum: int = 1
    eval_every: int = 0
    log: str | None = None
    lora_rank: int | None = None
    lora_alpha: float | None = None
    lora_targets: str = "attn,mlp"
    lora_dropout: float = 0.0

    def __post_init__(self) -> None:
        for name, kinds in _TYPES.items():
            value = getattr(self, name)
            if not isinstance(value, kinds) or isinstance(value, bool) != (kinds is bool):
                want = " or ".join(k.__name__ for k in _as_tuple(kinds))
                raise ConfigError(
                    f"TrainConfig.{name} must be {want}, got {type(value).__name__} {value!r}"
                )
        for name in (
            "out",
            "data",
            "corpus",
            "disk_dir",
        ):  # str paths are fine: keep Paths from here on
            if getattr(self, name) == "":
                flag = "--" + name.replace("_", "-")
                raise ConfigError(f"{flag} is empty; give a path (use . for this folder)")
            if isinstance(getattr(self, name), str):
                object.__setattr__(self, name, Path(getattr(self, name)))
        for name, (lo, hi) in _INT_RANGES.items():
            value = getattr(self, name)
            if not lo <= value <= hi:
                flag = "--" + name.replace("_", "-")
                if lo == 1 and value < 1:
                    raise ConfigError(f"{flag} must be positive, got {value}")
                raise ConfigError(f"{flag} must be in [{lo}, {hi}], got {value}")
        self._check_data()
        if not (math.isfinite(self.lr) and 0 < self.lr <= 10):
            raise ConfigError(f"--lr must be positive and at most 10 (try 1e-3), got {self.lr}")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise ConfigError(f"weight_decay must be finite and >= 0, got {self.weight_decay}")
        if self.placement not in ("auto", "static"):
            raise ConfigError(
                f"unknown --placement {self.placement!r}; choose one of: auto, static"
            )
        if self.precision not in ("fp32", "bf16", "fp16"):
            raise ConfigError(
                f"unknown --precision {self.precision!r}; choose one of: fp32, bf16, fp16"
            )
        if not (math.isfinite(self.max_grad_norm) and self.max_grad_norm >= 0):
            raise ConfigError(f"--max-grad-norm must be finite and >= 0, got {self.max_grad_norm}")
        if self.tp_mode not in TP_MODES:
            raise ConfigError(
                f"unknown --tp-mode {self.tp_mode!r}; choose one of: {', '.join(TP_MODES)}"
            )
        if self.export not in EXPORTS:
            raise ConfigError(
                f"unknown --export {self.export!r}; choose one of: {', '.join(EXPORTS)}"
            )
        if self.schedule not in SCHEDULES:
            raise ConfigError(
                f"unknown --schedule {self.schedule!r}; choose one of: {', '.join(SCHEDULES)}"
            )
        plugin, zero = resolve_plugin(self)  # see [Note: choosing the plugin]
        object.__setattr__(self, "plugin", plugin)
        object.__setattr__(self, "zero", zero)
        if plugin == "zero":
            object.__setattr__(self, "zero_stage", zero)
        check_flags(self, zero)  # the capability table ([Note: capability table])
        if self.log not in (None, "tensorboard"):
            raise ConfigError(f"unknown --log {self.log!r}; the one choice is: tensorboard")
        if self.export == "every" and plugin in ("ddp", "hybrid"):
            raise ConfigError(
                f"--export every applies to the gemini and zero plugins, not {plugin} (ddp "
                "checkpoints are the full model; hybrid ones export with colossal.export_checkpoint"
                "); drop it"
            )
        if not self.save_final and self.export in ("final", "merged"):
            raise ConfigError(
                f"--no-final-save leaves no final checkpoint for --export {self.export}; add "
                "--export none (or drop --no-final-save)"
            )
        if self.max_grad_norm and plugin == "ddp":
            raise ConfigError(
                "--max-grad-norm is not built for --plugin ddp; use --zero 1 or drop it"
            )
        if self.model not in ("gpt", "palm") and not self.model.startswith("hf:"):
            raise ConfigError(
                f"unknown --model {self.model!r}; choose one of: gpt, palm, hf:PATH (a local "
                "Hugging Face config.json or saved folder)"
            )
        self._check_tiers()
        check_lora_flags(self)
        if self.plugin == "zero" or self.zero_stage != 1:
            self._check_zero()
        if self.plugin in ("ddp", "hybrid"):
            given = [
                f"--{k.replace('_', '-')} {v}"
                for k, v in (
                    ("placement", self.placement),
                    ("accelerator_budget", self.accelerator_budget),
                    ("precision", self.precision),
                )
                if v != _GEMINI_DEFAULTS[k] and (k != "precision" or self.plugin == "ddp")
            ]
            if given:
                raise ConfigError(
                    f"{', '.join(given)} applies to --plugin gemini only, not {self.plugin}; drop "
                    "it or use --plugin gemini"
                )

    def exports_at(self, step: int) -> bool:
        """Whether the checkpoint saved after ``step`` carries the consolidated model."""
        final = self.export in ("final", "merged")
        return self.export == "every" or (final and step == self.steps)

    def _check_data(self) -> None:
        """``corpus`` as a synonym of ``data``; the fraction and dropout in range."""
        if self.data is not None and self.corpus is not None and self.data != self.corpus:
            raise ConfigError(
                f"--data {self.data} and --corpus {self.corpus} disagree; --corpus is the older "
                "name of --data: give one"
            )
        object.__setattr__(self, "data", self.data or self.corpus)
        object.__setattr__(self, "corpus", self.data)
        if not (math.isfinite(self.val_fraction) and 0 <= self.val_fraction < 1):
            raise ConfigError(f"--val-fraction must be in [0, 1), got {self.val_fraction}")
        if self.dropout is not None:
            if not (math.isfinite(self.dropout) and 0 <= self.dropout < 1):
                raise ConfigError(f"--dropout must be in [0, 1), got {self.dropout}")
            if self.model != "gpt":
                raise ConfigError(
                    f"--dropout applies to --model gpt, not {self.model} (a Hugging Face model "
                    "keeps its config.json's dropout); drop it"
                )

    def _check_tiers(self) -> None:
        """Host and disk budgets (Gemini only); the disk directory is checked before anything
        runs or is written."""
        from colossal_zero import check_disk_dir

        from ..booster import parse_bytes

        given = [
            f"--{k.replace('_', '-')} {getattr(self, k)}"
            for k in ("host_budget", "disk_budget", "disk_dir")
            if getattr(self, k) is not None
        ]
        if given and self.plugin != "gemini":
            raise ConfigError(
                f"{', '.join(given)} applies to --plugin gemini only, not {self.plugin}; drop "
                "it or use --plugin gemini"
            )
        if self.disk_dir is not None and self.disk_budget is None:
            raise ConfigError("--disk-dir needs --disk-budget (say, --disk-budget 64GiB)")
        parse_bytes(self.host_budget)
        if self.disk_budget is not None:
            check_disk_dir(self.disk_dir, parse_bytes(self.disk_budget))

    def _check_zero(self) -> None:
        from colossal_zero import ZeroConfig  # its stage check: one message for stage 3

        if self.plugin != "zero":
            raise ConfigError(
                f"--zero-stage applies to --plugin zero only, not {self.plugin}; drop it or use "
                "--plugin zero"
            )
        ZeroConfig(stage=self.zero_stage)
        given = [
            f"--{k.replace('_', '-')} {getattr(self, k)}"
            for k in ("placement", "accelerator_budget")
            if getattr(self, k) != _GEMINI_DEFAULTS[k]
        ]
        if given:
            raise ConfigError(
                f"{', '.join(given)} applies to --plugin gemini only, not zero; drop it or use "
                "--plugin gemini"
            )


def _as_tuple(kinds: type | tuple[type, ...]) -> tuple[type, ...]:
    return kinds if isinstance(kinds, tuple) else (kinds,)


_TYPES: dict[str, type | tuple[type, ...]] = {
    "model": str,
    "preset": str,
    "steps": int,
    "batch_size": int,
    "seq_len": int,
    "seed": int,
    "data": (Path, str, type(None)),
    "corpus": (Path, str, type(None)),
    "tokenizer": (str, type(None)),
    "text_field": str,
    "val_fraction": (float, int),
    "dropout": (float, int, type(None)),
    "out": (Path, str),
    "plugin": (str, type(None)),
    "placement": str,
    "accelerator_budget": (str, int, type(None)),
    "host_budget": (str, int, type(None)),
    "disk_budget": (str, int, type(None)),
    "disk_dir": (Path, str, type(None)),
    "precision": str,
    "zero_stage": int,
    "lr": (float, int),
    "weight_decay": (float, int),
    "checkpoint_every": int,
    "save_final": bool,
    "export": str,
    "resume": bool,
    "restart": bool,
    "log_every": int,
    "zero": (int, type(None)),
    "tp": int,
    "tp_mode": str,
    "tp_depth": int,
    "sp": (str, type(None)),
    "sp_size": int,
    "pp": int,
    "microbatches": int,
    "schedule": str,
    "activation_checkpointing": bool,
    "max_grad_norm": (float, int),
    "layout": (str, type(None)),
    "grad_accum": int,
    "eval_every": int,
    "log": (str, type(None)),
    "lora_rank": (int, type(None)),
    "lora_alpha": (float, int, type(None)),
    "lora_targets": str,
    "lora_dropout": (float, int),
}
# (lowest, highest) of each integer setting
_INT_RANGES = {
    "steps": (1, 2**24 - 1),
    "batch_size": (1, 2**16),
    "seq_len": (1, 2**20),
    "seed": (0, 2**23 - 1),
    "checkpoint_every": (0, 2**24 - 1),
    "log_every": (1, 2**24 - 1),
    "tp": (1, 2**12),
    "tp_depth": (1, 2**12),
    "sp_size": (1, 2**12),
    "pp": (1, 2**12),
    "microbatches": (1, 2**16),
    "grad_accum": (1, 2**16),
    "eval_every": (0, 2**24 - 1),
}
_GEMINI_DEFAULTS = {"placement": "auto", "accelerator_budget": None, "precision": "fp32"}
