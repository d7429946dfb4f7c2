"""A LoRA checkpoint out of Colossal: the PEFT adapter folder, and the merged weights.

[Note: LoRA exports] A LoRA run's checkpoint holds the adapters (``...lora_A.default.weight``)
under the names ``peft`` gave them (see ``colossal.lora``'s [Note: where peft wraps]) and their
optimizer state; the frozen base is left out (``frozen_omitted``, colossal-zero's [Note: omitted
frozen values]) and rebuilt from its source: ``hf:PATH`` read again, our GPT or PaLM built from
its config after seeding with the run's ``--seed``, as the job built it; its SHA-256 must be
the recorded ``base_fingerprint``, else a ``CheckpointError``. (Checkpoints written before held
the base weights too, ``...base_layer.weight``; they load as they are.) Both exports rebuild
the job's module on the CPU with ``peft`` and the recorded ``LoraConfig`` and load the
checkpoint into it (nothing is missing or left over, tied aliases and the omitted base
aside), then let ``peft`` write: ``save_pretrained`` gives the adapter folder (``adapter_config.json`` and
``adapter_model.safetensors``) that ``PeftModel.from_pretrained(base, folder)`` loads, and
``merge_and_unload`` gives the merged model, whose state dict has the names of a plain run, so
the Hugging Face export (``export_hf``) and generation take it as they take any checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from colossal_contracts import CheckpointError, ConfigError
from colossal_models import GPT, GPTConfig, PaLM, PaLMConfig
from colossal_models._hf import import_transformers
from colossal_models.hf import HFCausalLM, load_hf_causal_lm
from colossal_zero.checkpoint import INDEX_FILE

from ..checkpoint._layout import LAYOUT_INDEX
from ..lora._apply import ADAPTER, base_fingerprint, import_peft, peft_config_of
from ._source import CheckpointInfo, iter_checkpoint_state, read_checkpoint

__all__ = ["ADAPTER_FOLDER", "export_adapter", "lora_model", "merged_state", "with_adapter"]

ADAPTER_FOLDER = "adapter"  # under a LoRA run's --out: the final PEFT adapter folder


def _omits_base(step: Path) -> bool:
    """Whether the checkpoint ``step`` left the frozen weights out ([Note: LoRA exports])."""
    for name in (INDEX_FILE, "meta.json", LAYOUT_INDEX):  # Gemini/ZeRO, DDP, hybrid
        try:
            record = json.loads((step / name).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and record.get("frozen_omitted"):
            return True
    return False


def _base_from_source(info: CheckpointInfo) -> nn.Module:
    """The base as the job built it ([Note: LoRA exports]), checked against the fingerprint."""
    seed = int(info.train_config.get("seed", 0))
    with torch.random.fork_rng(devices=[]):  # the caller's generator is left as it was
        torch.manual_seed(seed)
        if info.model.startswith("hf:"):
            try:
                model: nn.Module = load_hf_causal_lm(info.model[3:])
            except (OSError, ConfigError) as err:
                raise CheckpointError(
                    f"checkpoint {info.path} holds LoRA adapters without their base, and the base "
                    f"{info.model} cannot be read ({err}); restore that folder"
                ) from err
        else:
            model = _base_model(info)
    base = model.hf if isinstance(model, HFCausalLM) else model
    got, want = base_fingerprint(base), (info.lora or {}).get("base_fingerprint")
    if got != want:
        raise CheckpointError(
            f"checkpoint {info.path} holds LoRA adapters without their base, and the base "
            f"rebuilt from {info.model} (seed {seed}) is not the one they were trained on "
            f"(sha256 {got[:12]}..., recorded {str(want)[:12]}...); restore the base it trained on"
        )
    return model


def _base_model(info: CheckpointInfo) -> nn.Module:
    """The job's module before the wrap, freshly initialised (its weights are overwritten)."""
    if info.model == "gpt":
        return GPT(GPTConfig(**info.model_config))
    if info.model == "palm":
        return PaLM(PaLMConfig(**info.model_config))
    if info.model.startswith("hf:"):
        from ._hf_folder import hf_config_of  # (it imports this module)

        auto = import_transformers().AutoModelForCausalLM
        return HFCausalLM(auto.from_config(hf_config_of(info)).float())
    raise ConfigError(f"checkpoint {info.path} holds a {info.model!r} model, not gpt/palm/hf:")


def _peft_part(model: nn.Module) -> nn.Module:
    """The ``PeftModel`` inside the job's module ([Note: where peft wraps])."""
    return model.hf if isinstance(model, HFCausalLM) else model


def lora_model(info: CheckpointInfo) -> nn.Module:
    """The job's module of a LoRA checkpoint with its trained weights, fp32, on the CPU (see
    [Note: LoRA exports]); ``CheckpointError`` when the checkpoint does not fit it."""
    if info.lora is None:
        raise CheckpointError(f"checkpoint {info.path} is not of a LoRA run (no 'lora' record)")
    peft = import_peft()
    omitted = _omits_base(info.path)
    model = _base_from_source(info) if omitted else _base_model(info)
    config = peft_config_of(info.lora)
    if isinstance(model, HFCausalLM):
        model.hf = peft.get_peft_model(model.hf, config, adapter_name=ADAPTER)
    else:
        model = peft.get_peft_model(model, config, adapter_name=ADAPTER)
    state = dict(iter_checkpoint_state(info))
    missing, unexpected = model.load_state_dict(state, strict=False)
    params = model.state_dict(keep_vars=True)
    loaded = {id(params[n]) for n in state if n in params}
    absent = [n for n in missing if id(params[n]) not in loaded]  # a tied alias is loaded
    if omitted:  # the base came from its source
        absent = [n for n in absent if params[n].requires_grad]
    if absent or unexpected:
        raise CheckpointError(
            f"checkpoint {info.path} does not fit its LoRA model: missing {absent[:3]}, "
            f"unexpected {unexpected[:3]}; was trainer.json's 'lora' record edited?"
        )
    return model.float().eval()


def merged_state(info: CheckpointInfo) -> dict[str, torch.Tensor]:
    """The checkpoint's weights with the adapters merged in, under a plain run's names."""
    model = lora_model(info)
    with torch.no_grad():
        if isinstance(model, HFCausalLM):
            model.hf = model.hf.merge_and_unload()
        else:
            model = model.merge_and_unload()
    return {n: t.detach() for n, t in model.state_dict().items()}


def export_adapter(checkpoint: Path, out: Path) -> Path:
    """Write the adapters of a LoRA checkpoint (a run's ``--out``, its ``checkpoint/`` or a
    ``step-N`` folder) into ``out`` as a PEFT adapter folder; returns ``out``. One process."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"export folder {out} exists and is not empty; give a new folder")
    info = read_checkpoint(Path(checkpoint))
    if info.lora is None:
        raise ConfigError(
            f"checkpoint {info.path} is of a full fine-tune, not LoRA; export it with --hf OUT"
        )
    part = _peft_part(lora_model(info))
    base = info.model[3:] if info.model.startswith("hf:") else None  # ours: no HF name
    part.peft_config[ADAPTER].base_model_name_or_path = base
    part.save_pretrained(str(out), save_embedding_layers=False)  # LoRA only: no lookup
    return out


def with_adapter(model: nn.Module, adapter: Path) -> Any:
    """``model`` (a Hugging Face causal LM, or our GPT/PaLM) with the PEFT adapter folder
    ``adapter`` merged in, through ``PeftModel.from_pretrained`` and ``merge_and_unload``."""
    peft = import_peft()
    adapter = Path(adapter)
    if not (adapter / "adapter_config.json").is_file():
        raise ConfigError(
            f"--adapter {adapter}: no adapter_config.json; give a folder written by colossal "
            "train --lora-rank (out/adapter) or PeftModel.save_pretrained"
        )
    try:
        wrapped = peft.PeftModel.from_pretrained(model, str(adapter))
    except (ValueError, KeyError, RuntimeError) as err:
        cause = " ".join(str(err).split())[:200]
        raise ConfigError(f"--adapter {adapter} does not fit the model: {cause}") from err
    with torch.no_grad():
        return wrapped.merge_and_unload()
