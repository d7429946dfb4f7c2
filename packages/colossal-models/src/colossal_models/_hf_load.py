"""Hugging Face causal LMs from local files: the unmodified model behind the ``(idx, targets) ->
loss`` interface Colossal trains, and, where a state-dict adapter exists, the same weights as our
own GPT or PaLM so tensor and pipeline parallelism apply.

[Note: local only] ``path`` is a ``config.json`` or a folder written by ``save_pretrained``.
Nothing is downloaded (``local_files_only``). A folder with weights (``model.safetensors``,
``pytorch_model.bin`` or their sharded indexes) loads them; a bare config builds the model with
Hugging Face's own initialisation, which draws from torch's global generator, so a fixed
``torch.manual_seed`` gives the same weights every time (and on every rank).

[Note: HF unmodified] ``HFCausalLM`` adds no layer and changes no weight: it calls the model on the
ids (``use_cache=False``) and takes the mean cross entropy of its logits against ``targets``,
which are already shifted by one (Colossal's corpora yield ``(x, y)`` with ``y = x[1:]``). HF's own
``labels=`` would shift a second time. Parameters are fp32 (precision is the plugins' business);
dropout is whatever the config says.

[Note: byte ids in a larger vocabulary] Colossal's byte tokenizer has 256 ids; HF vocabularies are
larger (GPT-2 has 50257). Byte ids are valid ids of any vocabulary that size or larger, so the model
trains as is: the logits still cover the full vocabulary (the first loss is about ln V, not ln 256)
and the embedding rows above 255 only receive the softmax's push-down through the tied or untied
head. A pretrained model's ids 0..255 mean other strings in its own tokenizer, so fine-tuning on
bytes re-learns them; a vocabulary smaller than the tokenizer's is refused.

[Note: adapters] ``from_hf`` converts ``gpt2`` to ``GPT`` (``GPT2StateDictAdapter``) and ``llama``
to a Llama-shaped ``PaLM`` (``LlamaStateDictAdapter``) with the weights ``load_hf_causal_lm`` would
give under the same seed (it builds the HF model, then maps its state dict), so a run with and
without tensor parallelism starts from the same point. Other architectures have no adapter.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from colossal_contracts import ConfigError

from ._hf import hf_attr, import_transformers
from ._hf_sources import hf_weight_sources, index_files, unreadable_weights
from ._inputs import check_token_ids
from .gpt import GPT, GPT2StateDictAdapter, GPTConfig
from .palm import LlamaStateDictAdapter, PaLM, PaLMConfig

__all__ = [
    "HF_TP_ADAPTERS",
    "HFCausalLM",
    "check_hf_sizes",
    "from_hf",
    "hf_adapter_config",
    "hf_lazy_sources",
    "hf_max_positions",
    "hf_num_params",
    "hf_state_adapter",
    "load_hf_causal_lm",
    "load_hf_config",
]

# model_type -> what ``from_hf`` converts it to (see [Note: adapters])
HF_TP_ADAPTERS: dict[str, str] = {"gpt2": "GPT", "llama": "PaLM (Llama-shaped)"}
_WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


class HFCausalLM(nn.Module):
    """An unmodified Hugging Face causal LM (``self.hf``) trained through ``forward(idx, targets)``
    (see [Note: HF unmodified]). ``forward(idx)`` gives the logits ``(B, T, V)``."""

    hf: nn.Module  # a transformers ``*ForCausalLM``

    def __init__(self, hf: nn.Module) -> None:
        super().__init__()
        self.hf = hf
        self.vocab_size = int(hf.config.vocab_size)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        check_token_ids(idx, self.vocab_size)
        logits = self.hf(input_ids=idx, use_cache=False).logits  # (B, T, V)
        if targets is None:
            return logits
        check_token_ids(targets, self.vocab_size, what="targets")
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def _config_file(path: Path) -> Path:
    if not path.exists():
        raise ConfigError(
            f"hf:{path}: no such file or folder; give a local config.json or a folder saved by "
            "save_pretrained (nothing is downloaded)"
        )
    file = path / "config.json" if path.is_dir() else path
    if not file.is_file():
        raise ConfigError(
            f"hf:{path}: the folder has no config.json; give a folder saved by save_pretrained "
            "or the path of a config.json"
        )
    return file


# sizes a causal LM's config.json may state, each a positive int when present
_SIZE_KEYS = (
    "hidden_size", "n_embd", "num_hidden_layers", "n_layer", "num_attention_heads", "n_head",
    "num_key_value_heads", "intermediate_size", "n_inner", "ffn_dim", "vocab_size",
    "max_position_embeddings", "n_positions", "head_dim",
)  # fmt: skip


def check_hf_sizes(raw: Any, where: str) -> None:
    """``ConfigError`` naming the first size of the config dict ``raw`` (read from ``where``)
    that is present but not a positive int (a string, a negative or a fraction)."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must hold a JSON object")
    for key in _SIZE_KEYS:
        value = raw.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ConfigError(
                f"{where}: {key!r} must be a positive int, got {value!r}; fix the config"
            )


def _check_weight_files(folder: Path) -> None:
    """``ConfigError`` when a sharded index names a file outside ``folder`` (or none there)."""
    for name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        files = index_files(folder, name)
        if files is None:
            continue
        root = folder.resolve()
        for f in files:
            target = (folder / f).resolve()
            if target.parent != root:
                raise ConfigError(
                    f"hf:{folder}: {name} names {f!r}, outside the model folder; an index may "
                    "only name files beside it"
                )
            if not target.is_file():
                raise ConfigError(f"hf:{folder}: {name} names {f!r}, which is missing")


def load_hf_config(path: str | Path) -> Any:
    """The ``transformers`` config of the causal LM at ``path`` (see [Note: local only]);
    ``ConfigError`` when the path or its config.json is missing or unreadable, when the config
    is not a causal LM's, or when transformers is not installed."""
    path = Path(path)
    file = _config_file(path)
    try:
        raw = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"hf:{path}: cannot read {file.name} as JSON ({exc})") from exc
    model_type = raw.get("model_type") if isinstance(raw, dict) else None
    check_hf_sizes(raw, f"hf:{path}: {file.name}")
    if not model_type:
        raise ConfigError(
            f"hf:{path}: {file.name} has no model_type; save the config with save_pretrained"
        )
    transformers = import_transformers()
    try:
        config = transformers.AutoConfig.for_model(**raw)
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"hf:{path}: transformers {transformers.__version__} does not know model_type "
            f"{model_type!r}; upgrade transformers or give another model"
        ) from exc
    if type(config) not in transformers.MODEL_FOR_CAUSAL_LM_MAPPING:
        raise ConfigError(
            f"hf:{path}: model_type {model_type!r} is not a causal language model "
            "(no AutoModelForCausalLM class); give a decoder such as gpt2 or llama"
        )
    return config


def _weights_folder(path: Path) -> Path | None:
    folder = path if path.is_dir() else path.parent
    return folder if any((folder / name).is_file() for name in _WEIGHT_FILES) else None


def _building_on_meta() -> bool:
    return torch.empty(0).device.type == "meta"  # under ``with torch.device("meta")``


def load_hf_causal_lm(path: str | Path, *, config: Any = None, weights: bool = True) -> HFCausalLM:
    """The causal LM at ``path``, fp32, unmodified, wrapped in ``HFCausalLM``: its saved weights
    when the folder holds them, else Hugging Face's initialisation from the config (see
    [Note: local only]). Under ``torch.device("meta")`` it only builds the shapes. ``weights``
    False: the initialisation even where the folder holds weights (a lazy build then reads them
    tensor by tensor: ``hf_lazy_sources``)."""
    path = Path(path)
    config = load_hf_config(path) if config is None else config
    transformers = import_transformers()
    auto = transformers.AutoModelForCausalLM
    weights_at = None if _building_on_meta() or not weights else _weights_folder(path)
    if weights_at is None:
        hf = auto.from_config(config)
    else:
        _check_weight_files(weights_at)
        try:
            hf = auto.from_pretrained(weights_at, config=config, local_files_only=True)
        except Exception as exc:  # truncated safetensors, refused pickles, torn shards, ...
            raise unreadable_weights(path, exc) from exc
    return HFCausalLM(hf.float().train())


def hf_lazy_sources(path: str | Path, config: Any = None) -> dict[str, Any] | None:
    """For a lazy build of ``path``'s model (its ``HFCausalLM.hf``): name -> a function reading
    that saved tensor alone, {} without saved weights, None where the weights cannot be read
    tensor by tensor ([Note: HF weights tensor by tensor]); the folder's files checked first."""
    path = Path(path)
    config = load_hf_config(path) if config is None else config
    folder = _weights_folder(path)
    if folder is None:
        return {}
    _check_weight_files(folder)
    with torch.device("meta"):
        hf = import_transformers().AutoModelForCausalLM.from_config(config)
    return hf_weight_sources(folder, hf)


def hf_num_params(config: Any) -> int:
    """Parameters of the model ``config`` describes (tied ones counted once), built on meta."""
    with torch.device("meta"):
        hf = import_transformers().AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in hf.parameters())


def hf_adapter_config(config: Any) -> GPTConfig | PaLMConfig:
    """Our config for the HF ``config`` (see [Note: adapters]); ``ConfigError`` naming the
    architectures that have an adapter, or saying which option does not map."""
    kind = hf_attr(config, "model_type", "?")
    if kind == "gpt2":
        return GPT2StateDictAdapter.config_from_hf(config)
    if kind == "llama":
        return LlamaStateDictAdapter.config_from_hf(config)
    names = ", ".join(f"{k} -> {v}" for k, v in HF_TP_ADAPTERS.items())
    raise ConfigError(
        f"Hugging Face model_type {kind!r} has no adapter to Colossal's layers, so tensor, "
        f"pipeline and sequence parallelism cannot shard it (adapters exist for: {names}); "
        "train it without --tp/--pp/--sp (Gemini, ZeRO or DDP)"
    )


def hf_state_adapter(config: Any) -> GPT2StateDictAdapter | LlamaStateDictAdapter:
    """The state-dict adapter between the HF ``config``'s model and our GPT or PaLM (see
    [Note: adapters]); ``ConfigError`` as ``hf_adapter_config``."""
    ours = hf_adapter_config(config)
    if isinstance(ours, GPTConfig):
        return GPT2StateDictAdapter(ours)
    return LlamaStateDictAdapter(ours)


def from_hf(path: str | Path, *, config: Any = None) -> GPT | PaLM:
    """Our ``GPT`` or ``PaLM`` holding the weights ``load_hf_causal_lm(path)`` gives under the
    same seed (see [Note: adapters]); ``ConfigError`` when the architecture has no adapter."""
    config = load_hf_config(path) if config is None else config
    adapter = hf_state_adapter(config)
    ours = adapter.config
    family: Any = GPT if isinstance(ours, GPTConfig) else PaLM
    if _building_on_meta():
        return family(ours)
    state = load_hf_causal_lm(path, config=config).hf.state_dict()  # drawn first, as before
    model = family(ours)
    model.load_state_dict(adapter.from_hf(state))
    return model


def hf_max_positions(config: Any) -> int:
    """The longest sequence the HF ``config`` takes (none stated: ``sys.maxsize``)."""
    limit = hf_attr(config, "max_position_embeddings", 0) or hf_attr(config, "n_positions", 0)
    return int(limit or sys.maxsize)
