"""``export_hf``: a checkpoint of any plugin as a Hugging Face model folder that
``AutoModelForCausalLM.from_pretrained`` (and, with tokenizer files, ``AutoTokenizer``) loads.

[Note: Hugging Face names] Three kinds of checkpoint map onto transformers' names:

- ``--model hf:PATH`` trained unmodified (Gemini, ZeRO, DDP without tp): the weights are the
  HF model's own under ``HFCausalLM``'s ``hf.`` prefix, which is dropped; ``config.json`` is the
  HF config the run recorded.
- ``--model hf:PATH`` trained as our GPT or PaLM (tensor, pipeline or sequence parallelism
  convert it through a state-dict adapter): the adapter maps the weights back; ``config.json``
  is again the run's own HF config.
- native ``gpt`` and ``palm``: ``GPT2StateDictAdapter`` gives ``GPT2LMHeadModel`` weights and
  config; ``LlamaStateDictAdapter`` gives ``LlamaForCausalLM`` for a Llama-shaped PaLM and
  refuses a PaLM proper (parallel block, LayerNorm: no Llama equivalent).

Tied weights are written once, as ``save_pretrained`` does: of the names sharing one parameter
in the HF model (``lm_head.weight`` and the embedding), only the first in module order is
stored, and ``from_pretrained`` ties the others. Every other weight of the HF model must be
present with its shape, or nothing is written.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from colossal_contracts import CheckpointError, ConfigError
from colossal_models import GPTConfig, PaLMConfig
from colossal_models._hf import import_transformers
from colossal_models.hf import GPT2StateDictAdapter, LlamaStateDictAdapter, hf_adapter_config

from ..booster import ShardedSafetensorsWriter, parse_bytes
from ._lora import ADAPTER_FOLDER, export_adapter, merged_state
from ._source import CheckpointInfo, iter_checkpoint_state, read_checkpoint
from ._tokenizer_files import TOKENIZER_FILES, run_tokenizer, write_tokenizer_files

__all__ = [
    "HF_FOLDER",
    "HF_PREFIX",
    "TOKENIZER_FILES",
    "export_after_training",
    "export_hf",
    "hf_config_of",
    "hf_state_of",
]

HF_FOLDER = "hf"  # under a run's --out: the final Hugging Face export of an hf: model
HF_PREFIX = "hf."  # HFCausalLM's attribute holding the transformers model


def _adapter(info: CheckpointInfo) -> GPT2StateDictAdapter | LlamaStateDictAdapter:
    """The adapter from our names for what the checkpoint trained (see [Note: Hugging Face
    names]); ``ConfigError`` for a model that does not map."""
    if info.model.startswith("hf:"):
        ours: GPTConfig | PaLMConfig = hf_adapter_config(hf_config_of(info))
    elif info.model == "gpt":
        ours = GPTConfig(**info.model_config)
    elif info.model == "palm":
        ours = PaLMConfig(**info.model_config)
    else:
        raise ConfigError(
            f"checkpoint {info.path} holds a {info.model!r} model; only gpt, palm and hf: "
            "models export to Hugging Face"
        )
    if isinstance(ours, GPTConfig):
        return GPT2StateDictAdapter(ours)
    return LlamaStateDictAdapter(ours)  # refuses a PaLM proper, saying why


def hf_config_of(info: CheckpointInfo) -> Any:
    """The transformers config of the checkpoint's model: the run's recorded HF config for
    ``hf:`` models, the adapter's for native GPT (GPT-2) and Llama-shaped PaLM (Llama)."""
    if not info.model.startswith("hf:"):
        return _adapter(info).config_to_hf()
    raw = info.model_config.get("hf_config")
    if not isinstance(raw, dict) or "model_type" not in raw:
        raise CheckpointError(
            f"checkpoint {info.path}: trainer.json records no Hugging Face config for "
            f"{info.model}; it was not written by colossal train"
        )
    raw = {k: v for k, v in raw.items() if k not in ("transformers_version", "architectures")}
    try:
        return import_transformers().AutoConfig.for_model(**raw)
    except (ValueError, KeyError, TypeError) as err:
        raise ConfigError(f"checkpoint {info.path}: cannot rebuild its HF config ({err})") from err


def hf_state_of(info: CheckpointInfo) -> Iterator[tuple[str, torch.Tensor]]:
    """``(transformers name, fp32 tensor)`` of the checkpoint's weights (see [Note: Hugging
    Face names]); prefixed ``hf:`` weights stream one at a time, adapted ones are converted
    as a whole state dict; a LoRA checkpoint's are merged first ([Note: LoRA exports])."""
    state = iter(merged_state(info).items()) if info.lora else iter_checkpoint_state(info)
    first = next(state, None)
    if first is None:
        raise CheckpointError(f"checkpoint {info.path} holds no weights")
    if first[0].startswith(HF_PREFIX):
        yield first[0].removeprefix(HF_PREFIX), first[1]
        for name, tensor in state:
            yield name.removeprefix(HF_PREFIX), tensor
        return
    ours = {first[0]: first[1], **dict(state)}
    yield from _adapter(info).to_hf(ours).items()


def _hf_skeleton(config: Any) -> dict[str, tuple[str | None, tuple[int, ...]]]:
    """For every state-dict name of the HF model: (the name it is tied to, or None; shape)."""
    transformers = import_transformers()
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    first: dict[int, str] = {}
    out: dict[str, tuple[str | None, tuple[int, ...]]] = {}
    for name, t in model.state_dict(keep_vars=True).items():
        owner = first.setdefault(id(t), name)
        out[name] = (None if owner == name else owner, tuple(t.shape))
    return out


def export_hf(checkpoint: Path, out: Path, *, max_shard_bytes: int | str = "2GiB") -> Path:
    """Write the checkpoint (a run's ``--out``, its ``checkpoint/`` or a ``step-N`` folder of
    any plugin) into ``out`` as a Hugging Face folder: ``config.json``, safetensors shards
    with ``model.safetensors.index.json`` under transformers' names, tied weights once, and
    the run's tokenizer files (see [Note: the run's tokenizer]). Returns ``out``. One process,
    no collective; ``ConfigError``/``CheckpointError`` before anything is written when the
    model does not map (see [Note: Hugging Face names]) or the tokenizer is gone."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"export folder {out} exists and is not empty; give a new folder")
    info = read_checkpoint(Path(checkpoint))
    config = hf_config_of(info)
    tokenizer = run_tokenizer(info)  # files gone: an error before anything is written
    limit = parse_bytes(max_shard_bytes)
    if not limit:
        raise ConfigError("max_shard_bytes must be a positive size such as '2GiB'")
    skeleton = _hf_skeleton(config)
    state = hf_state_of(info)
    seen: set[str] = set()
    with ShardedSafetensorsWriter(out, max_shard_bytes=limit) as writer:
        for name, tensor in state:
            tied, shape = skeleton.get(name, (name, ()))
            if tied is not None:
                continue  # a tied alias, or a buffer transformers does not save
            if tuple(tensor.shape) != shape:
                raise CheckpointError(
                    f"checkpoint {info.path}: {name} has shape {list(tensor.shape)}, the "
                    f"{config.model_type} config says {list(shape)}"
                )
            writer.add(name, tensor.contiguous())
            seen.add(name)
        missing = sorted(n for n, (tied, _) in skeleton.items() if tied is None and n not in seen)
        if missing:
            raise CheckpointError(
                f"checkpoint {info.path} lacks {len(missing)} weights of the "
                f"{config.model_type} model ({missing[:3]}); was it saved from another model?"
            )
    config.architectures = [_causal_lm_class(config)]
    config.save_pretrained(str(out))
    write_tokenizer_files(tokenizer, out)
    return out


def _causal_lm_class(config: Any) -> str:
    transformers = import_transformers()
    return transformers.MODEL_FOR_CAUSAL_LM_MAPPING[type(config)].__name__


def export_after_training(
    model: str, export: str, checkpoint: Path | None, out: Path, *, lora: bool = False
) -> Path | None:
    """After the final save of ``colossal train``: an ``hf:`` model's checkpoint exported to
    ``out/hf`` (unless ``--export none``); a LoRA run's adapters to ``out/adapter`` (a PEFT
    folder), and with ``--export merged`` its merged model to ``out/hf`` (any model that
    exports to Hugging Face). The folder written last, or None when nothing was exported."""
    if checkpoint is None or export == "none":
        return None
    if lora:
        folder = export_adapter(checkpoint, Path(out) / ADAPTER_FOLDER)
        if export != "merged":
            return folder
    elif not model.startswith("hf:"):
        return None
    return export_hf(checkpoint, Path(out) / HF_FOLDER)
