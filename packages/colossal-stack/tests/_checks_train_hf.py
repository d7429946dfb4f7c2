"""Rank-side checks of ``--model hf:PATH`` (run in a colossal_testing World, or in one process).

Each case builds the model through ``resolve_model("hf:PATH")`` (as ``colossal train`` does),
trains it through the Booster on this rank's rows of the global batch, and compares the losses
(averaged over ranks) and the final weights with the unmodified Hugging Face model loaded
straight from the folder and trained on the whole batch with ``torch.optim.AdamW``, fp32.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
import transformers
from _stack_reference import adamw_losses

from colossal import Booster, DDPPlugin, GeminiPlugin, HybridParallelPlugin, LowLevelZeroPlugin
from colossal.train._models import resolve_model
from colossal_zero import GeminiModule

B, T, LR, VOCAB = 4, 16, 1e-3, 256


def write_models(root: str) -> dict[str, str]:
    """Tiny random HF models saved with ``save_pretrained`` under ``root`` (dropout 0)."""
    torch.manual_seed(0)
    configs = {
        "gpt2": transformers.GPT2Config(
            n_layer=2,
            n_embd=32,
            n_head=4,
            vocab_size=300,
            n_positions=T,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            bos_token_id=0,
            eos_token_id=0,
        ),
        "llama": transformers.LlamaConfig(
            num_hidden_layers=2,
            hidden_size=32,
            intermediate_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=300,
            max_position_embeddings=T,
            bos_token_id=0,
            eos_token_id=0,
            pad_token_id=0,
        ),
        "opt": transformers.OPTConfig(
            num_hidden_layers=2,
            hidden_size=32,
            ffn_dim=64,
            num_attention_heads=4,
            word_embed_proj_dim=32,
            vocab_size=300,
            max_position_embeddings=T,
            dropout=0.0,
            attention_dropout=0.0,
            bos_token_id=0,
            eos_token_id=0,
            pad_token_id=1,
        ),
    }
    out = {}
    for name, cfg in configs.items():
        model = transformers.AutoModelForCausalLM.from_config(cfg)
        with torch.no_grad():  # random norms and biases, so nothing matches by accident
            for n, p in model.named_parameters():
                if p.dim() == 1:
                    p.normal_(0.0 if n.endswith("bias") else 1.0, 0.1)
        folder = f"{root}/{name}"
        model.save_pretrained(folder)
        out[name] = folder
    return out


def _batches(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(3)
    data = [torch.randint(0, VOCAB, (B, T + 1), generator=g) for _ in range(steps)]
    return [(d[:, :-1], d[:, 1:]) for d in data]


def _reference(folder: str, steps: int) -> tuple[list[float], dict[str, torch.Tensor]]:
    """The unmodified HF model from the folder, plain AdamW on the whole batch."""
    ref = transformers.AutoModelForCausalLM.from_pretrained(folder).float().train()
    losses = adamw_losses(ref, _batches(steps), LR, loss_of=_hf_loss)
    return losses, {n: p.detach().clone() for n, p in ref.named_parameters()}


def _hf_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=x, use_cache=False).logits
    return F.cross_entropy(logits.flatten(0, 1), y.flatten())


def _plugin(name: str, settings: dict):  # type: ignore[no-untyped-def]
    plugins = {
        "gemini": GeminiPlugin,
        "zero": LowLevelZeroPlugin,
        "ddp": DDPPlugin,
        "hybrid": HybridParallelPlugin,
    }
    return plugins[name](**settings)


def train_plugins(folder: str, cases: list[tuple[str, dict]], steps: int) -> list[dict]:
    """For each (plugin name, settings): relative loss error (worst step) and weight error
    (worst parameter, Frobenius; not with "hybrid", whose weights are GPT/PaLM shards) of
    ``steps`` Booster steps against one ``_reference`` run."""
    ref_losses, ref_weights = _reference(folder, steps)
    return [_train_one(folder, n, kw, steps, ref_losses, ref_weights) for n, kw in cases]


def _train_one(
    folder: str,
    plugin_name: str,
    settings: dict,
    steps: int,
    ref_losses: list[float],
    ref_weights: dict[str, torch.Tensor],
) -> dict:
    world = dist.get_world_size() if dist.is_initialized() else 1
    plugin = _plugin(plugin_name, settings)
    parallel = plugin_name == "hybrid"
    spec = resolve_model(f"hf:{folder}", "tiny", vocab_size=VOCAB, parallel=parallel)
    torch.manual_seed(0)
    model = spec.build()
    kind = type(model).__name__
    booster = Booster(plugin)
    model, opt = booster.boost(model, torch.optim.AdamW(model.parameters(), lr=LR))
    coord, dp = plugin.data_rank() if parallel else (dist.get_rank() if world > 1 else 0, world)
    rows = slice(coord * B // dp, (coord + 1) * B // dp)
    losses = []
    for x, y in _batches(steps):
        loss = model(x[rows], y[rows])
        booster.backward(loss, opt)
        opt.step()
        opt.zero_grad(set_to_none=True)
        t = loss.detach().float().reshape(1)
        if world > 1:
            dist.all_reduce(t)
        losses.append(float(t) / world)
    loss_err = max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses, strict=True))
    weight_err = None
    if parallel:
        plugin.close()
    else:  # the same HF parameter names, full weights gathered from the plugin
        full = _full_state(booster, model)
        weight_err = max(
            float((full[f"hf.{n}"].detach().float() - want).norm() / want.norm())
            for n, want in ref_weights.items()
        )
    return {
        "plugin": plugin_name,
        "loss_err": loss_err,
        "weight_err": weight_err,
        "kind": kind,
        "label": spec.label,
    }


def _full_state(booster: Booster, model: torch.nn.Module) -> dict:
    if isinstance(model, GeminiModule):
        return model.full_state_dict()  # collective: every rank gathers
    return dict(booster.unwrap(model).named_parameters())
