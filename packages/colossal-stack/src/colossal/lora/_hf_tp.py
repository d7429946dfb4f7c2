"""LoRA on a Hugging Face model under tensor parallelism: its ``peft`` model converted to our
GPT or PaLM with the same base weights and the same adapters, the adapters keeping their names.

[Note: Hugging Face LoRA under tp] The hybrid plugin shards our GPT and PaLM only. A ``peft``
model of a Hugging Face GPT-2 or Llama inside ``HFCausalLM`` (what ``colossal train --model
hf:PATH --lora-rank R`` wraps, [Note: where peft wraps]) is converted before it is sharded:

- the base weights through the model's state-dict adapter (colossal-models'
  ``hf_state_adapter``: GPT-2's ``Conv1D`` weights, ``(in, out)``, transposed into our Linear
  ones; Llama's renamed);
- each adapter copied as it is onto the layer its base weight maps to. ``peft`` keeps
  ``lora_A`` ``(r, in)`` and ``lora_B`` ``(out, r)`` as Linear weights whatever the base
  (GPT-2's ``fan_in_fan_out`` only transposes the merged update), and the adapters only rename
  (no row or column of a mapped weight moves: GPT-2's ``c_attn`` columns are our ``qkv`` rows
  in order), so ``B @ A`` is the same update of the same weight, and the forward
  ``base(x) + B(A(x)) * scaling`` gives the same values.

The converted model is sharded like any ([Note: LoRA under tp]). Its trainable parameters keep
the names they have in the user's module (``ConvertedLora.names``, e.g.
``hf.base_model.model.transformer.h.0.attn.c_attn.lora_A.default.weight``): the optimizer's
groups are found by them and the checkpoints are written under them, adapters only ([Note:
LoRA layout checkpoint]), so a tp run's checkpoint reads as a Gemini or ZeRO one and exports
the same PEFT adapter folder under Hugging Face names. Plain LoRA on linear layers only: DoRA,
trained biases, ``modules_to_save`` or per-layer ranks (``rank_pattern``) are refused.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from colossal_contracts import ConfigError
from colossal_models import GPT, GPTConfig, PaLM
from colossal_models.hf import HFCausalLM, hf_state_adapter

from ._apply import import_peft
from ._tp import is_peft_model

__all__ = ["ConvertedLora", "hf_lora_to_ours"]

_ROLES = ("lora_A", "lora_B")


@dataclass(frozen=True)
class ConvertedLora:
    """A ``peft`` model of our GPT or PaLM converted from a Hugging Face one.

    Attributes:
        model: the ``PeftModel`` of our GPT or PaLM (unsharded), adapters trainable.
        names: each trainable parameter's name in ``model`` -> its name in the user's module.
    """

    model: nn.Module
    names: dict[str, str]


def _fail(what: str) -> ConfigError:
    return ConfigError(
        f"LoRA on a Hugging Face model under tensor parallelism: {what}; use plain LoRA (peft "
        "LoraConfig with r, lora_alpha, lora_dropout, target_modules) or drop --tp"
    )


def _sites(hf: nn.Module, layer_map: dict[str, str]) -> dict[str, nn.Module]:
    """HF layer name -> its ``peft`` LoRA layer; ``ConfigError`` for a kind without a rule."""
    lora = import_peft().tuners.lora
    out = {}
    for name, m in hf.named_modules():
        if not isinstance(m, lora.LoraLayer):
            continue
        dora = any(m.use_dora.values())
        if dora or not isinstance(m, lora.Linear):
            what = "DoRA" if dora else f"peft's {type(m).__name__}"
            raise _fail(f"{name} is {what}, not plain LoRA on a linear layer")
        if name not in layer_map:
            raise _fail(f"{name} has no counterpart in our {type(hf).__name__} layers")
        out[name] = m
    return out


def hf_lora_to_ours(model: nn.Module) -> ConvertedLora | None:
    """``model`` (an ``HFCausalLM`` whose Hugging Face model ``peft`` wrapped) as a ``peft``
    model of our GPT or PaLM ([Note: Hugging Face LoRA under tp]); None for any other model.
    ``ConfigError`` (one line) for an architecture without a state-dict adapter or a LoRA
    beyond plain adapters on linear layers. Leaves torch's generator as it was."""
    if not isinstance(model, HFCausalLM) or not is_peft_model(model.hf):
        return None
    peft = import_peft()
    part = model.hf
    if len(part.peft_config) != 1:
        raise _fail(f"it holds {len(part.peft_config)} adapters; train one")
    adapter_name, config = next(iter(part.peft_config.items()))
    hf = part.get_base_model()
    state_adapter = hf_state_adapter(hf.config)  # ConfigError: no adapter for this type
    layer_map = {  # HF layer -> ours, from the weights' names
        h.removesuffix(".weight"): o.removesuffix(".weight")
        for o, h in state_adapter.key_map().items()
        if o.endswith(".weight") and h.endswith(".weight")
    }
    sites = _sites(hf, layer_map)
    if not sites:
        raise _fail("peft adapted no layer")
    user_name = {id(p): n for n, p in model.named_parameters()}
    adapters = {id(getattr(m, r)[adapter_name].weight) for m in sites.values() for r in _ROLES}
    for n, p in model.named_parameters():
        if p.requires_grad and id(p) not in adapters:
            raise _fail(f"{n} trains and is not a LoRA adapter weight")
    base_state = {
        k.replace(".base_layer.", "."): v
        for k, v in hf.state_dict().items()
        if not any(f".{r}." in k for r in _ROLES)
    }
    ours_state = state_adapter.from_hf(base_state)
    dtype = next(iter(ours_state.values())).dtype
    lora_config = peft.LoraConfig(
        r=config.r,
        lora_alpha=config.lora_alpha,
        lora_dropout=config.lora_dropout,
        use_rslora=config.use_rslora,
        target_modules=[layer_map[s] for s in sites],
        bias="none",
    )
    with torch.random.fork_rng(devices=[]), torch.no_grad():  # the caller's draws stay put
        cfg = state_adapter.config
        base = (GPT(cfg) if isinstance(cfg, GPTConfig) else PaLM(cfg)).to(dtype)
        base.load_state_dict(ours_state)
        base.requires_grad_(False)
        wrapped = peft.get_peft_model(base, lora_config, adapter_name=adapter_name)
        inner = wrapped.get_base_model()
        ours_name = {id(p): n for n, p in wrapped.named_parameters()}
        names = {}
        for name, theirs in sites.items():
            mine = inner.get_submodule(layer_map[name])
            if (mine.r, mine.scaling) != (theirs.r, theirs.scaling):
                raise _fail(f"{name} has its own rank or alpha (rank_pattern/alpha_pattern)")
            for role in _ROLES:
                src = getattr(theirs, role)[adapter_name].weight
                dst = getattr(mine, role)[adapter_name].weight
                dst.copy_(src)
                dst.requires_grad_(src.requires_grad)
                names[ours_name[id(dst)]] = user_name[id(src)]
    wrapped.train(model.training)
    return ConvertedLora(wrapped, names)
