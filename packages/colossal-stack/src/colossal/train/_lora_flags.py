"""The job's LoRA flags, checked once with the rest of ``TrainConfig`` (no model built yet):
the settings themselves (``colossal.lora.LoraSpec``) and the flags that need ``--lora-rank``
(the layouts LoRA runs on are rows of the capability table); and, once the model is built, its
wrap and the resume check."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import nn

from colossal_contracts import CheckpointError, ConfigError

from ..lora import LoraSpec, apply_lora

if TYPE_CHECKING:
    from ._config import TrainConfig

__all__ = ["apply_job_lora", "check_lora_flags", "lora_spec"]


def lora_spec(cfg: TrainConfig) -> LoraSpec | None:
    """The run's LoRA settings; None for full fine-tuning."""
    if cfg.model.lora_rank is None:
        return None
    return LoraSpec(
        rank=cfg.model.lora_rank,
        alpha=None if cfg.model.lora_alpha is None else float(cfg.model.lora_alpha),
        targets=tuple(cfg.model.lora_targets.split(",")),
        dropout=float(cfg.model.lora_dropout),
    )


def check_lora_flags(cfg: TrainConfig) -> None:
    """``ConfigError`` (one line) for LoRA settings out of range, LoRA flags without
    ``--lora-rank`` and ``--export merged`` without LoRA."""
    if cfg.model.lora_rank is None:
        given = [
            flag
            for flag, changed in (
                ("--lora-alpha", cfg.model.lora_alpha is not None),
                ("--lora-targets", cfg.model.lora_targets != "attn,mlp"),
                ("--lora-dropout", cfg.model.lora_dropout != 0.0),
            )
            if changed
        ]
        if given:
            raise ConfigError(f"{', '.join(given)} needs --lora-rank R (say, --lora-rank 8)")
        if cfg.checkpoint.export == "merged":
            raise ConfigError(
                "--export merged merges LoRA adapters into the base; it needs --lora-rank R "
                "(a full fine-tune exports with --export final)"
            )
        return
    lora_spec(cfg)  # the settings' own ranges; LoRA's layouts are rows of the capability
    # table (``colossal._capability``), checked with the other flags


def apply_job_lora(
    cfg: TrainConfig, label: str, model: nn.Module, resume_from: Path | None
) -> tuple[nn.Module, dict[str, Any] | None]:
    """The job's model with ``peft`` LoRA adapters when ``--lora-rank`` is given, and its
    record for ``trainer.json``; with ``--resume``, the checkpoint's LoRA settings and base
    fingerprint must be the run's ([Note: base fingerprint]), else a one-line error before
    anything is loaded."""
    spec = lora_spec(cfg)
    record = None
    if spec is not None:
        model, record = apply_lora(model, spec, label=label)
        n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
        record["trainable_params"] = n_train
    if resume_from is not None:
        _check_resume(resume_from, record)
    return model, record


def _check_resume(root: Path, record: dict[str, Any] | None) -> None:
    from ..booster import latest_checkpoint
    from ..booster._booster import TRAINER_FILE, read_trainer_file

    path = root if (root / TRAINER_FILE).is_file() else latest_checkpoint(root)
    saved = read_trainer_file(path).get("lora")
    if saved is None and record is None:
        return
    if saved is None or record is None:
        which = "LoRA" if saved is not None else "a full fine-tune"
        fix = "drop --lora-rank" if record is not None else "pass its --lora-* flags"
        raise CheckpointError(
            f"--resume: the checkpoint {path} is of {which}, this run is not; {fix} to continue it"
        )
    if saved.get("base_fingerprint") != record["base_fingerprint"]:
        raise CheckpointError(
            f"--resume: the base weights differ from those the checkpoint {path} trained its "
            f"adapters on (sha256 {str(saved.get('base_fingerprint'))[:12]}..., now "
            f"{record['base_fingerprint'][:12]}...); resume on the same --model, --preset and "
            "--seed, or start a fresh --out"
        )
    keys = ("rank", "alpha", "target_modules", "dropout")
    changed = [k for k in keys if saved.get(k) != record.get(k)]
    if changed:
        was = ", ".join(f"{k} {saved.get(k)!r}" for k in changed)
        raise CheckpointError(
            f"--resume: the checkpoint {path} trained LoRA with {was}; pass the same --lora-* "
            "flags to continue it"
        )
