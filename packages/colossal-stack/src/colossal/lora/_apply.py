"""LoRA on a model through Hugging Face ``peft``: the settings, the wrap, the base fingerprint.

[Note: where peft wraps] ``peft.get_peft_model`` wraps the model whose names an adapter folder
must use: a Hugging Face model (``HFCausalLM.hf``) is replaced by its ``PeftModel`` inside
``HFCausalLM``, so ``PeftModel.save_pretrained`` writes names that
``PeftModel.from_pretrained(AutoModelForCausalLM..., folder)`` loads; our GPT and PaLM are
wrapped whole (their ``forward(idx, targets)`` passes through). Every base parameter is frozen
(``requires_grad=False``); only ``lora_A``/``lora_B`` train.

[Note: base fingerprint] A LoRA checkpoint is only meaningful on the base weights it was trained
on. ``base_fingerprint`` is a SHA-256 over the base model's parameters and buffers in name order
(name, dtype, shape and bytes of each, tied tensors once), taken before the wrap; the job
records it with the run and refuses a ``--resume`` whose base hashes otherwise.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from colossal_contracts import ConfigError

from ._targets import linear_layers, peft_target_modules, resolve_targets

__all__ = [
    "LoraSpec",
    "apply_lora",
    "base_fingerprint",
    "check_lora_optimizer",
    "has_lora",
    "import_peft",
    "lora_layers",
    "lora_record",
    "peft_config_of",
]

ADAPTER = "default"  # peft's adapter name


def import_peft() -> Any:
    """The ``peft`` module, or a ``ConfigError`` saying how to install it."""
    try:
        import peft
    except ModuleNotFoundError as err:  # peft absent; its own failures (or a stop) propagate
        if err.name != "peft":
            raise
        raise ConfigError(
            "LoRA needs the peft library: pip install 'colossal-stack[lora]'"
        ) from None
    return peft


@dataclass(frozen=True)
class LoraSpec:
    """LoRA settings of a run.

    Attributes:
        rank: the rank r of each adapter (1 to the narrowest adapted layer's width).
        alpha: the scaling numerator (updates are scaled by alpha / r); None: r (scale 1).
        targets: groups ("attn", "mlp") and module names, see [Note: LoRA targets].
        dropout: dropout on the adapters' input (0: none).
    """

    rank: int
    alpha: float | None = None
    targets: tuple[str, ...] = ("attn", "mlp")
    dropout: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.rank, int) or isinstance(self.rank, bool) or self.rank < 1:
            raise ConfigError(f"--lora-rank must be a positive int (try 8), got {self.rank!r}")
        if self.alpha is not None and not (math.isfinite(self.alpha) and self.alpha > 0):
            raise ConfigError(f"--lora-alpha must be positive (try 16), got {self.alpha}")
        if not (math.isfinite(self.dropout) and 0 <= self.dropout < 1):
            raise ConfigError(f"--lora-dropout must be in [0, 1), got {self.dropout}")
        targets = tuple(t.strip() for t in self.targets if t.strip())
        if not targets:
            raise ConfigError("--lora-targets is empty; give attn, mlp or module names")
        object.__setattr__(self, "targets", targets)

    @property
    def lora_alpha(self) -> float:
        return float(self.rank if self.alpha is None else self.alpha)


def _base_of(model: nn.Module) -> tuple[nn.Module, str]:
    """The module peft wraps ([Note: where peft wraps]) and the attribute holding it ("" for
    the model itself)."""
    hf = getattr(model, "hf", None)
    if isinstance(hf, nn.Module) and type(model).__name__ == "HFCausalLM":
        return hf, "hf"
    return model, ""


def lora_layers(model: nn.Module, spec: LoraSpec, *, label: str) -> list[str]:
    """The linear layers of ``model`` that ``spec`` adapts; ``ConfigError`` (one line) when
    its targets match nothing or its rank is above a chosen layer's width."""
    names = resolve_targets(model, spec.targets, label=label)
    widths = linear_layers(model)
    narrow = min(names, key=lambda n: min(widths[n]))
    if spec.rank > min(widths[narrow]):
        raise ConfigError(
            f"--lora-rank {spec.rank} is above the width of {label}'s layer {narrow} "
            f"({widths[narrow][0]} -> {widths[narrow][1]}); use --lora-rank "
            f"{min(widths[narrow])} or less"
        )
    return names


def base_fingerprint(model: nn.Module) -> str:
    """SHA-256 of the model's parameters and buffers ([Note: base fingerprint])."""
    h = hashlib.sha256()
    seen: set[int] = set()
    tensors = [*model.named_parameters(), *model.named_buffers()]
    for name, t in sorted(tensors, key=lambda kv: kv[0]):
        if id(t) in seen:
            continue
        seen.add(id(t))
        data = t.detach().cpu().contiguous()
        h.update(f"{name}|{data.dtype}|{tuple(data.shape)}\n".encode())
        h.update(data.view(torch.uint8).numpy())  # hashed in place: no bytes copy
    return h.hexdigest()


def apply_lora(model: nn.Module, spec: LoraSpec, *, label: str) -> tuple[nn.Module, dict]:
    """``model`` with LoRA adapters from ``peft`` on the layers ``spec.targets`` select, every
    base weight frozen; and the run's LoRA record (``lora_record``) with the base fingerprint.
    ``ConfigError`` (one line) when the targets select nothing or the rank exceeds a layer."""
    peft = import_peft()
    base, attr = _base_of(model)
    names = lora_layers(base, spec, label=label)
    fingerprint = base_fingerprint(base)
    modules = peft_target_modules(base, names)
    config = peft.LoraConfig(
        r=spec.rank,
        lora_alpha=spec.lora_alpha,
        lora_dropout=spec.dropout,
        target_modules=modules,
        bias="none",
    )
    wrapped = peft.get_peft_model(base, config, adapter_name=ADAPTER)
    if attr:
        setattr(model, attr, wrapped)
    else:
        model = wrapped
    return model, lora_record(spec, modules, fingerprint)


def lora_record(spec: LoraSpec, modules: list[str], fingerprint: str) -> dict[str, Any]:
    """What a run records of its LoRA (``trainer.json``'s ``lora``): the settings, peft's
    ``target_modules`` and the base fingerprint."""
    return {
        **asdict(spec),
        "targets": list(spec.targets),
        "target_modules": list(modules),
        "base_fingerprint": fingerprint,
    }


def peft_config_of(record: dict[str, Any]) -> Any:
    """The ``LoraConfig`` a recorded run trained with."""
    peft = import_peft()
    rank = int(record["rank"])
    alpha = record.get("alpha")
    return peft.LoraConfig(
        r=rank,
        lora_alpha=float(rank if alpha is None else alpha),
        lora_dropout=float(record.get("dropout", 0.0)),
        target_modules=list(record["target_modules"]),
        bias="none",
    )


_LORA_OPTIMIZERS = (torch.optim.Adam, torch.optim.AdamW)


def has_lora(model: nn.Module) -> bool:
    """Whether ``model`` holds a ``peft`` model (LoRA adapters)."""
    return any(hasattr(m, "peft_config") for m in model.modules())


def check_lora_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """``ConfigError`` when ``model`` carries LoRA adapters and ``optimizer`` is not Adam or
    AdamW (the optimizer the plugins shard and the planner counts for adapters)."""
    if has_lora(model) and not isinstance(optimizer, _LORA_OPTIMIZERS):
        raise ConfigError(
            f"LoRA trains with torch.optim.Adam or AdamW, got {type(optimizer).__name__}; "
            "build the optimizer as torch.optim.AdamW(trainable parameters)"
        )
