"""What ``colossal train`` runs: one flat dataclass, validated once."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from colossal_contracts import ConfigError

__all__ = ["TrainConfig"]


@dataclass(frozen=True)
class TrainConfig:
    """A training run.

    Attributes:
        model: model family ("gpt" or "palm").
        preset: named size of that family (``GPTConfig.preset``, ``PaLMConfig.preset``); vocab is
            the byte tokenizer's.
        steps: optimizer steps.
        batch_size: sequences per step on each rank (global batch = batch_size * ranks).
        seq_len: tokens per sequence.
        seed: seeds model init (same on every rank) and data (offset per rank).
        corpus: text file or folder; None is the embedded default (Python's standard library).
        out: directory for metrics.jsonl, the checkpoint and plots.
        plugin: training strategy ("gemini": ZeRO-3 over chunks under a memory budget, or "ddp").
        placement: Gemini chunk placement, "auto" (traced, Belady eviction) or "static".
        accelerator_budget: Gemini's byte budget on the accelerator ("512MiB", "2GiB"); None: all
            of it (on an emulated accelerator: no limit).
        precision: Gemini's training precision: "fp32", "bf16" or "fp16" (fp32 masters).
        lr: peak learning rate (linear warmup over 10% of steps, cosine decay to 10% of it).
        weight_decay: AdamW decay, applied to matrices only.
        checkpoint_every: save every N steps (0: only at the end).
        resume: continue from the checkpoint under ``out`` (``out/checkpoint/latest``).
        log_every: refresh the progress display every N steps.
    """

    model: str = "gpt"
    preset: str = "tiny"
    steps: int = 200
    batch_size: int = 16
    seq_len: int = 128
    seed: int = 0
    corpus: Path | None = None
    out: Path = Path("runs/latest")
    plugin: str = "gemini"
    placement: str = "auto"
    accelerator_budget: str | None = None
    precision: str = "fp32"
    lr: float = 2e-3
    weight_decay: float = 0.1
    checkpoint_every: int = 0
    resume: bool = False
    log_every: int = 1

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "seq_len", "log_every"):
            if getattr(self, name) <= 0:
                raise ConfigError(
                    f"--{name.replace('_', '-')} must be positive, got {getattr(self, name)}"
                )
        if self.checkpoint_every < 0:
            raise ConfigError(f"--checkpoint-every must be >= 0, got {self.checkpoint_every}")
        if not self.lr > 0:
            raise ConfigError(f"--lr must be positive, got {self.lr}")
        if self.placement not in ("auto", "static"):
            raise ConfigError(
                f"unknown --placement {self.placement!r}; choose one of: auto, static"
            )
        if self.precision not in ("fp32", "bf16", "fp16"):
            raise ConfigError(
                f"unknown --precision {self.precision!r}; choose one of: fp32, bf16, fp16"
            )
        if self.model not in ("gpt", "palm"):
            raise ConfigError(f"unknown --model {self.model!r}; choose one of: gpt, palm")
