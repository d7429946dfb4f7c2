"""The model and tokenizer that generation runs: from a checkpoint of any plugin (a run's
``--out``, its ``checkpoint/`` or a ``step-N`` folder) or a Hugging Face folder
(``config.json`` and weights, such as ``colossal export --hf`` writes).

[Note: which tokenizer] Text becomes ids the way the run made them: the tokenizer the checkpoint
records (``bytes``, or ``hf:PATH`` read with the ``tokenizers`` library; see export's [Note:
the run's tokenizer] for older checkpoints). A Hugging Face folder uses its tokenizer files
when it has them, else bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from colossal_contracts import CheckpointError, ConfigError
from colossal_models import GPT, ByteTokenizer, GPTConfig, PaLM, PaLMConfig
from colossal_models._hf import import_transformers
from colossal_models.data import HFTokenizer

from ..export import (
    CheckpointInfo,
    hf_config_of,
    hf_state_of,
    iter_checkpoint_state,
    merged_state,
    run_tokenizer,
    with_adapter,
)
from ..export import read_checkpoint as _read_checkpoint

__all__ = ["Loaded", "TextCodec", "load_for_generation"]

_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


class TextCodec:
    """Text <-> ids through the byte tokenizer or a ``tokenizers.Tokenizer``."""

    def __init__(self, tokenizer: Any = None) -> None:
        self.tokenizer = tokenizer  # None: bytes

    @classmethod
    def from_file(cls, path: Path) -> TextCodec:
        from tokenizers import Tokenizer

        try:
            return cls(Tokenizer.from_file(str(path)))
        except Exception as err:  # tokenizers raises its own exception type
            raise ConfigError(f"cannot read the tokenizer {path}: {err}") from err

    def encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            return ByteTokenizer().encode(text).tolist()
        return list(self.tokenizer.encode(text).ids)

    def decode(self, ids: list[int]) -> str:
        if self.tokenizer is None:  # ids past the bytes (a larger HF vocabulary) are dropped
            return ByteTokenizer().decode([i for i in ids if 0 <= i < 256])
        return self.tokenizer.decode(ids)


@dataclass
class Loaded:
    """A model ready to generate with.

    Attributes:
        model: GPT, PaLM or a ``transformers`` causal LM, fp32, in eval mode, on the CPU.
        kind: "native" (GPT, PaLM: ``colossal_models.KVCache``) or "hf" (its own cache).
        codec: the tokenizer (see [Note: which tokenizer]).
        eos_token_id: generation stops after it (None: never).
        source: what was loaded, for messages.
    """

    model: nn.Module
    kind: str
    codec: TextCodec
    eos_token_id: int | None
    source: str


def _tokenizer_file(folder: Path | None) -> Path | None:
    if folder is None:
        return None
    file = folder if folder.is_file() else folder / "tokenizer.json"
    return file if file.is_file() else None


def _codec_of(info: CheckpointInfo) -> TextCodec:
    tokenizer = run_tokenizer(info)  # the one the run trained with; ConfigError when gone
    return TextCodec(tokenizer.backend) if isinstance(tokenizer, HFTokenizer) else TextCodec()


def _eos(config: Any) -> int | None:
    eos = getattr(config, "eos_token_id", None)
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    return eos if isinstance(eos, int) else None


def _load_native(info: CheckpointInfo) -> nn.Module:
    family, config_cls = (GPT, GPTConfig) if info.model == "gpt" else (PaLM, PaLMConfig)
    model = family(config_cls(**info.model_config))
    state = merged_state(info) if info.lora else dict(iter_checkpoint_state(info))  # base+LoRA
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise CheckpointError(
            f"checkpoint {info.path} does not match its {info.model} config: missing "
            f"{missing[:3]}, unexpected {unexpected[:3]}"
        )
    return model


def _load_hf_from_checkpoint(info: CheckpointInfo) -> nn.Module:
    config = hf_config_of(info)
    model = import_transformers().AutoModelForCausalLM.from_config(config)
    state = dict(hf_state_of(info))
    missing, unexpected = model.load_state_dict(state, strict=False)
    params = dict(model.named_parameters())  # tied names once: a missing alias is fine
    absent = [n for n in missing if n in params]
    if absent or [n for n in unexpected if n not in dict(model.named_buffers())]:
        raise CheckpointError(
            f"checkpoint {info.path} does not match its {config.model_type} config: missing "
            f"{absent[:3]}, unexpected {unexpected[:3]}"
        )
    model.tie_weights()
    return model


def _is_hf_folder(path: Path) -> bool:
    return (path / "config.json").is_file() and any((path / w).is_file() for w in _WEIGHTS)


def load_for_generation(path: str | Path, *, adapter: str | Path | None = None) -> Loaded:
    """The model and tokenizer at ``path`` (see the module docstring), with the PEFT adapter
    folder ``adapter`` merged in when given (a LoRA run's checkpoint needs none: its adapters
    are merged already); ``CheckpointError`` in one line when ``path`` is neither a
    checkpoint nor a Hugging Face folder."""
    loaded = _load(Path(path))
    if adapter is not None:
        loaded.model = with_adapter(loaded.model, Path(adapter)).float().eval()
        loaded.source += f" + adapter {adapter}"
    return loaded


def _load(path: Path) -> Loaded:
    if not path.exists():
        raise CheckpointError(f"{path}: no such folder; give a run's --out or a checkpoint")
    if _is_hf_folder(path) and not (path / "trainer.json").is_file():
        transformers = import_transformers()
        model = transformers.AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
        file = _tokenizer_file(path)
        codec = TextCodec.from_file(file) if file else TextCodec()
        return Loaded(model.float().eval(), "hf", codec, _eos(model.config), str(path))
    info = _read_checkpoint(path)
    if info.model in ("gpt", "palm"):
        model, kind, eos = _load_native(info), "native", None
    elif info.model.startswith("hf:"):
        model = _load_hf_from_checkpoint(info)
        kind, eos = "hf", _eos(model.config)
    else:
        raise ConfigError(
            f"checkpoint {info.path} holds a {info.model!r} model, not a language model"
        )
    with torch.no_grad():
        model = model.float().eval()
    return Loaded(model, kind, _codec_of(info), eos, str(info.path))
