"""Which model ``colossal train --model NAME --preset P`` builds: one lookup, shared by the loop,
the preflight check and the plugins that need to know whether a model can be tensor-parallel."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from torch import nn

from colossal_contracts import ConfigError
from colossal_models import GPT, GPT_PRESETS, PALM_PRESETS, GPTConfig, PaLM, PaLMConfig

__all__ = ["MODEL_FAMILIES", "ModelSpec", "resolve_model"]

MODEL_FAMILIES = ("gpt", "palm")  # and "hf:PATH" (a local Hugging Face config or saved folder)


@dataclass(frozen=True)
class ModelSpec:
    """A model the training job can build.

    Attributes:
        label: what the display calls it ("gpt-tiny").
        build: a fresh model; the same weights under the same ``torch.manual_seed``. Its
            ``forward(idx, targets)`` returns the mean next-token loss.
        num_params: parameters of one built model.
        max_seq_len: the longest sequence it takes.
        num_layers: transformer blocks (what pipeline stages split).
        tp_capable: ``colossal_models.parallelize`` (and pipeline stages) know its layers.
        presets: the family's named sizes, for "try a smaller preset" hints ({} when none).
        config: the model's configuration, a JSON-able dict recorded with checkpoints.
    """

    label: str
    build: Callable[[], nn.Module]
    num_params: int
    max_seq_len: int
    num_layers: int
    tp_capable: bool = True
    presets: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)


_FAMILIES: dict[str, tuple[type[nn.Module], Any, dict[str, Any]]] = {
    "gpt": (GPT, GPTConfig, GPT_PRESETS),
    "palm": (PaLM, PaLMConfig, PALM_PRESETS),
}


def resolve_model(model: str, preset: str, *, vocab_size: int) -> ModelSpec:
    """The model called ``model`` ("gpt", "palm") at ``preset`` with ``vocab_size`` tokens;
    ``ConfigError`` naming the choices when unknown."""
    if model not in _FAMILIES:
        raise ConfigError(f"unknown --model {model!r}; choose one of: {', '.join(MODEL_FAMILIES)}")
    family, config_cls, presets = _FAMILIES[model]
    cfg = config_cls.preset(preset).with_vocab(vocab_size)
    return ModelSpec(
        label=f"{model}-{preset}",
        build=lambda: family(cfg),
        num_params=cfg.num_params(),
        max_seq_len=cfg.max_seq_len,
        num_layers=cfg.num_layers,
        presets=presets,
        config=asdict(cfg),
    )
