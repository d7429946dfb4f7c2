"""Which model ``colossal train --model NAME --preset P`` builds: one lookup, shared by the loop,
the preflight check and the plugins that need to know whether a model can be tensor-parallel.

``--model hf:PATH`` is a Hugging Face causal LM from a local ``config.json`` or saved folder
(colossal-models' ``load_hf_causal_lm``; ``--preset`` does not apply). It trains unmodified
unless the run shards layers (``parallel=True``: tensor, pipeline or sequence parallelism); then
it is converted to GPT or PaLM through a state-dict adapter, with the same starting weights, or
refused with ``ModelSpec.tp_unsupported`` where no adapter exists.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch
from torch import nn

from colossal_contracts import ConfigError
from colossal_models import (
    GPT,
    GPT_PRESETS,
    PALM_PRESETS,
    GPTConfig,
    PaLM,
    PaLMConfig,
    apply_activation_checkpointing,
)
from colossal_models.hf import (
    HF_TP_ADAPTERS,
    HFCausalLM,
    from_hf,
    hf_adapter_config,
    hf_lazy_sources,
    hf_max_positions,
    hf_num_params,
    load_hf_causal_lm,
    load_hf_config,
)
from colossal_zero import LazyInit

__all__ = [
    "HF_PREFIX",
    "LAZY_PLUGINS",
    "MODEL_FAMILIES",
    "ModelSpec",
    "build_model",
    "enable_activation_checkpointing",
    "resolve_model",
]

HF_PREFIX = "hf:"
LAZY_PLUGINS = ("gemini", "zero", "hybrid")  # they materialize a meta model: [Note: lazy job]
MODEL_FAMILIES = ("gpt", "palm", "hf:PATH")  # hf: a local Hugging Face config or saved folder


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
        tp_capable: ``colossal_models.parallelize`` (and pipeline stages) know its layers, or
            an adapter converts it to a model whose layers they know (``--model hf:`` GPT-2
            and Llama).
        tp_unsupported: when not ``tp_capable``, the one-line reason, naming the architectures
            that have adapters (the ``ConfigError`` message for ``--tp``); "" otherwise.
        presets: the family's named sizes, for "try a smaller preset" hints ({} when none).
        config: the model's configuration, a JSON-able dict recorded with checkpoints.
        lazy: the model can be built inside ``colossal.lazy_init()`` with eager construction's
            values: GPT and PaLM, and a Hugging Face model trained as itself whose weights are
            its initialisation or safetensors files ([Note: HF weights tensor by tensor]); one
            converted through an adapter (``parallel``) or saved as pickles is built eagerly.
        build_lazy: how to build it inside a ``LazyInit`` when that is more than ``build``
            inside it (a Hugging Face folder: from its config, each saved tensor then assigned
            its file); None: ``build``.
    """

    label: str
    build: Callable[[], nn.Module]
    num_params: int
    max_seq_len: int
    num_layers: int
    tp_capable: bool = True
    tp_unsupported: str = ""
    presets: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    lazy: bool = True
    build_lazy: Callable[[LazyInit], nn.Module] | None = None


_FAMILIES: dict[str, tuple[type[nn.Module], Any, dict[str, Any]]] = {
    "gpt": (GPT, GPTConfig, GPT_PRESETS),
    "palm": (PaLM, PaLMConfig, PALM_PRESETS),
}


def resolve_model(
    model: str,
    preset: str,
    *,
    vocab_size: int,
    parallel: bool = False,
    dropout: float | None = None,
) -> ModelSpec:
    """The model called ``model`` ("gpt", "palm", "hf:PATH") at ``preset`` with ``vocab_size``
    tokens (the tokenizer's: GPT and PaLM take it as their vocabulary, a Hugging Face model's
    embedding must hold it); ``ConfigError`` naming the choices when unknown. ``dropout``: GPT's
    (None: the preset's).

    ``parallel``: the run shards layers (tensor, pipeline or sequence parallelism), so ``build``
    must return GPT or PaLM; a Hugging Face model without an adapter is then a ``ConfigError``
    (``tp_unsupported``). Other models ignore it.
    """
    if model.startswith(HF_PREFIX):
        return _resolve_hf(model[len(HF_PREFIX) :], vocab_size=vocab_size, parallel=parallel)
    if model not in _FAMILIES:
        raise ConfigError(f"unknown --model {model!r}; choose one of: {', '.join(MODEL_FAMILIES)}")
    family, config_cls, presets = _FAMILIES[model]
    cfg = config_cls.preset(preset).with_vocab(vocab_size)
    if dropout is not None:
        cfg = replace(cfg, dropout=dropout)
    return ModelSpec(
        label=f"{model}-{preset}",
        build=lambda: family(cfg),
        num_params=cfg.num_params(),
        max_seq_len=cfg.max_seq_len,
        num_layers=cfg.num_layers,
        presets=presets,
        config=asdict(cfg),
    )


def _resolve_hf(path: str, *, vocab_size: int, parallel: bool) -> ModelSpec:
    """``hf:PATH``: the HF model as saved (or its adapted GPT/PaLM when ``parallel``)."""
    if not path:
        raise ConfigError("--model hf: needs a path: hf:PATH to a config.json or a saved folder")
    hf_config = load_hf_config(path)
    kind = hf_config.model_type
    if hf_config.vocab_size < vocab_size:
        raise ConfigError(
            f"the tokenizer has {vocab_size} ids, more than the {hf_config.vocab_size} rows of "
            f"hf:{path}'s embedding; give a tokenizer of at most {hf_config.vocab_size} ids "
            "(the model's own: --tokenizer hf:MODEL_DIR) or a model with a larger vocabulary"
        )
    try:
        ours = hf_adapter_config(hf_config)
        reason = ""
    except ConfigError as err:
        ours, reason = None, f"--model hf:{path}: {err}"
    if parallel and ours is None:
        raise ConfigError(reason)
    record = {"hf_path": path, "model_type": kind, "hf_config": hf_config.to_dict()}
    common = dict(
        tp_capable=ours is not None,
        tp_unsupported=reason,
        config=json.loads(json.dumps(record, default=str)),
    )
    if parallel and ours is not None:
        return ModelSpec(
            label=f"hf-{kind} as {HF_TP_ADAPTERS[kind]}",
            build=lambda: from_hf(path, config=hf_config),
            num_params=ours.num_params(),
            max_seq_len=ours.max_seq_len,
            num_layers=ours.num_layers,
            lazy=False,  # the adapter converts a whole state dict on the host
            **common,
        )
    sources = hf_lazy_sources(path, hf_config)

    def build_lazy(init: LazyInit) -> nn.Module:
        model = load_hf_causal_lm(path, config=hf_config, weights=False)
        for name, t in [*model.hf.named_parameters(), *model.hf.named_buffers()]:
            if sources and name in sources:
                init.assign(t, sources[name])
        return model

    return ModelSpec(
        label=f"hf-{kind}",
        build=_keeping_rng(lambda: load_hf_causal_lm(path, config=hf_config)),
        num_params=hf_num_params(hf_config),
        max_seq_len=hf_max_positions(hf_config),
        num_layers=int(getattr(hf_config, "num_hidden_layers", 0) or 0),
        lazy=sources is not None,
        build_lazy=_keeping_rng(build_lazy),
        **common,
    )


def _keeping_rng(build: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
    """``build`` leaving torch's CPU generator where it found it: loading saved weights eagerly
    and replaying the initialisation lazily draw differently, and the run after them must not
    depend on which ran ([Note: lazy job])."""

    def kept(*args: Any) -> nn.Module:
        with torch.random.fork_rng(devices=[]):  # the CPU generator, restored on the way out
            return build(*args)

    return kept


def enable_activation_checkpointing(model: nn.Module) -> None:
    """Recompute each block's activations in backward: GPT's and PaLM's blocks through their
    flag, a Hugging Face model through its own ``gradient_checkpointing_enable``
    (non-reentrant, as our blocks); ``ConfigError`` for a model with neither."""
    if apply_activation_checkpointing(model):
        return
    hf = getattr(model, "hf", None)
    if isinstance(model, HFCausalLM) and getattr(hf, "supports_gradient_checkpointing", False):
        hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return
    raise ConfigError(
        f"--activation-checkpointing: {type(model).__name__} has no blocks to recompute; drop it"
    )


def build_model(
    spec: ModelSpec, plugin: str, *, lazy: bool = True
) -> tuple[nn.Module, LazyInit | None]:
    """The job's model and the ``LazyInit`` it was built in (None: built eagerly).

    [Note: lazy job] Under the plugins of ``LAZY_PLUGINS`` the job builds GPT and PaLM on the
    meta device inside a ``LazyInit`` and hands it to the plugin, which materializes it where
    it lives: Gemini chunk by chunk into its tiers (with ``--tp``, each rank's slices), ZeRO-1/2
    and the hybrid plugin one tensor at a time onto their device, the hybrid plugin only this
    rank's stages and slices (the booster's [Note: lazy fill]). The values are eager
    construction's bit for bit, and the CPU generator leaves the build where eager construction
    leaves it, so data order and dropout do not change. Setup holds about one chunk (one tensor)
    beyond what the run keeps, instead of the whole fp32 model: what lets ``--disk-budget``
    train models larger than the host's memory. DDP keeps the eager build (it replicates the
    whole model anyway), and so do Hugging Face models converted through an adapter or saved as
    pickles (``ModelSpec.lazy``) and LoRA runs (``lazy=False``: the base is fingerprinted and
    wrapped by peft before the plugin sees it). A Hugging Face model trained as itself is built
    from its config and each saved tensor is read from its safetensors file when materialized;
    building it leaves the CPU generator untouched, lazily or not, so both runs draw alike.
    """
    if not (lazy and plugin in LAZY_PLUGINS and spec.lazy):
        return spec.build(), None
    with LazyInit() as init:
        model = spec.build() if spec.build_lazy is None else spec.build_lazy(init)
    return model, init
