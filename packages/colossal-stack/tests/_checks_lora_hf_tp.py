"""Rank-side checks of LoRA on a Hugging Face GPT-2 under the hybrid plugin with 1d tp2 (run
inside a colossal_testing World): ``HFCausalLM(peft model of GPT2LMHeadModel)`` boosted, which
the plugin trains as our GPT ([Note: Hugging Face LoRA under tp]), against plain ``peft`` on the
Hugging Face model with ``torch.optim.AdamW`` on one process.

The adapters are compared where the user sees them: the plugin's layout checkpoint, read back
whole under the Hugging Face peft names (the names the reference has), which must hold the
adapters and their Adam state only; a second boosted model loaded from the step-3 checkpoint
must repeat steps 4 and 5 bit for bit."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from _checks_lora_two_ranks import CLIP, LR, _batches, _frozen_state, _gpt2, reference_losses

from colossal import Booster, HybridParallelPlugin
from colossal.booster import iter_full_tensors
from colossal.lora import hf_lora_to_ours, lora_shard_maps
from colossal_models.hf import HFCausalLM

TARGETS = ["c_attn", "attn.c_proj", "c_fc", "mlp.c_proj"]


def _loss(m: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Next-token loss in the model's dtype (``HFCausalLM`` computes it in fp32)."""
    if isinstance(m, HFCausalLM):
        return F.cross_entropy(m.hf(input_ids=x).logits.flatten(0, 1), y.flatten())
    return m(x, y)


def _reference(dtype: torch.dtype) -> HFCausalLM:
    """``HFCausalLM`` of plain peft on a tiny GPT-2. float64: ``lora_B`` starts non-zero, so
    every factor moves; fp32: peft's own start (``lora_B`` = 0), as a run starts: with a
    non-zero start, AdamW amplifies fp32 rounding of the two models' different kernels (HF's
    Conv1D and GELU against our Linear) to 3.8e-6 on an adapter element with a gradient near
    its eps, while the same run in float64 agrees within 3e-15."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    base = _gpt2().to(dtype)
    cfg = LoraConfig(
        r=4, lora_alpha=8, target_modules=TARGETS, lora_dropout=0.0, fan_in_fan_out=True,
        init_lora_weights=dtype != torch.float64,
    )  # fmt: skip
    return HFCausalLM(get_peft_model(base, cfg))


def _boost(model: torch.nn.Module, zero: int, clip: float) -> tuple:
    plugin = HybridParallelPlugin(tp_size=2, zero_stage=zero, max_grad_norm=clip)
    booster = Booster(plugin)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR)
    boosted, opt = booster.boost(model, opt)
    return plugin, booster, boosted, opt


def _train(booster: Booster, model: torch.nn.Module, opt: object, batches: list) -> list[float]:
    out = []
    for x, y in batches:
        loss = model(x, y)
        booster.backward(loss, opt)
        opt.step()  # type: ignore[attr-defined]
        opt.zero_grad()  # type: ignore[attr-defined]
        out.append(loss.item())
    return out


def _live_err(model: torch.nn.Module, plugin: object, ref: torch.nn.Module, names: dict) -> float:
    """The worst error of the adapter elements this rank holds, against the reference's
    parameter of the same (Hugging Face) name; ``names``: ours -> the user's."""
    ref_params = dict(ref.named_parameters())
    maps = lora_shard_maps(model, plugin.mesh)  # type: ignore[attr-defined]
    worst = 0.0
    for n, p in model.named_parameters():
        if not p.requires_grad:
            continue
        full = ref_params[names[n]].detach()
        for piece in maps[n].pieces:
            mine = piece.global_view(p.detach()[piece.local.slices()])
            box = piece.to_global(piece.local)
            worst = max(worst, float((mine - full[box.slices()]).abs().max()))
    return worst


def lora_hf_tp_case(root: str, zero: int, dtype: str = "float32", clip: bool = False) -> dict:
    """``STEPS`` steps of LoRA on a tiny HF GPT-2 under tp2 with ZeRO stage ``zero`` (the whole
    batch on both tp ranks); the worst loss and adapter error against plain peft + AdamW, and
    what the checkpoints hold."""
    dt = getattr(torch, dtype)
    ref = _reference(dt)
    fresh = [copy.deepcopy(ref), copy.deepcopy(ref)]
    batches = _batches()
    want = reference_losses(ref, batches, _loss, clip=clip)

    rank = dist.get_rank()
    cut, final = Path(root) / "step-3", Path(root) / "step-5"
    for d in (cut, final):
        d.mkdir(parents=True, exist_ok=True)
    plugin, booster, model, opt = _boost(fresh[0], zero, CLIP if clip else 0.0)
    got = _train(booster, model, opt, batches[:3])
    plugin.save_checkpoint(model, opt, cut)
    got += _train(booster, model, opt, batches[3:])
    plugin.save_checkpoint(model, opt, final)
    frozen_state = _frozen_state(model, opt)
    live_err = _live_err(model, plugin, ref, hf_lora_to_ours(copy.deepcopy(fresh[1])).names)
    booster.close()
    plugin, booster, model, opt = _boost(fresh[1], zero, CLIP if clip else 0.0)
    plugin.load_checkpoint(model, opt, cut)
    resumed = _train(booster, model, opt, batches[3:])
    booster.close()
    dist.barrier()

    index = json.loads((final / "layout_index.json").read_text())
    saved = dict(iter_full_tensors(final))
    ref_adapters = {n: p.detach() for n, p in ref.named_parameters() if p.requires_grad}
    return {
        "rank": rank,
        "loss_err": max(abs(a - b) for a, b in zip(got, want, strict=True)),
        "resume_exact": resumed == got[3:],
        "same_names": sorted(saved) == sorted(ref_adapters),
        "num_adapters": len(saved),
        "adapter_err": live_err,
        "saved_err": max(float((saved[n].to(dt) - p).abs().max()) for n, p in ref_adapters.items()),
        "frozen_omitted": len(index.get("frozen_omitted", [])),
        "moments": sorted(index["tensors"]),
        "frozen_state": frozen_state,
    }
