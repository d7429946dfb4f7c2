"""Which linear layers LoRA adapts: ``attn`` and ``mlp`` resolved per model, or explicit names.

[Note: LoRA targets] ``--lora-targets`` is a comma list of groups and module names. ``attn``
is every linear layer inside an attention module (a path component naming attention: ``attn``,
``self_attn``, ``attention``), ``mlp`` every one inside a feed-forward module (``mlp``, ``ffn``,
``feed_forward``); so one rule covers our GPT (``attn.qkv``, ``attn.proj``, ``mlp.fc``,
``mlp.proj``), our PaLM (``attn.q/k/v/proj``, ``mlp.gate/up/proj``), Hugging Face GPT-2
(``attn.c_attn``, ``attn.c_proj``, ``mlp.c_fc``, ``mlp.c_proj``, its ``Conv1D``) and Llama
(``self_attn.q_proj`` ..., ``mlp.gate_proj`` ...). Any other entry is a module name matched
as ``peft`` matches it: the whole name or its last components (``c_attn``, ``attn.c_attn``).
The resolved layers go to ``peft`` as the shortest suffixes (parent.leaf) that select exactly
them, so ``adapter_config.json`` reads like a hand-written one.
"""

from __future__ import annotations

from torch import nn

from colossal_contracts import ConfigError

__all__ = ["LORA_GROUPS", "linear_layers", "resolve_targets"]

# group -> path components that mark it (see [Note: LoRA targets])
LORA_GROUPS: dict[str, tuple[str, ...]] = {
    "attn": ("attn", "self_attn", "attention", "self_attention", "attn_layer"),
    "mlp": ("mlp", "ffn", "feed_forward", "feedforward"),
}


def _is_linear(module: nn.Module) -> bool:
    """``nn.Linear``, or transformers' ``Conv1D`` (GPT-2's linear layers, weights (in, out))."""
    if isinstance(module, nn.Linear):
        return True
    return type(module).__name__ == "Conv1D" and type(module).__module__.startswith("transformers")


def linear_layers(model: nn.Module) -> dict[str, tuple[int, int]]:
    """Every linear layer of ``model``: name -> (in features, out features)."""
    out: dict[str, tuple[int, int]] = {}
    for name, module in model.named_modules():
        if not _is_linear(module):
            continue
        if isinstance(module, nn.Linear):
            out[name] = (module.in_features, module.out_features)
        else:  # Conv1D: weight (in, out)
            w = module.weight
            out[name] = (int(w.shape[0]), int(w.shape[1]))
    return out


def _matches(name: str, target: str) -> bool:
    return name == target or name.endswith("." + target)


def _in_group(name: str, group: str) -> bool:
    return any(part in LORA_GROUPS[group] for part in name.split(".")[:-1])


def _summary(names: list[str]) -> str:
    """The distinct layer suffixes of ``names`` (parent.leaf), for messages."""
    seen = dict.fromkeys(".".join(n.split(".")[-2:]) for n in names)
    return ", ".join(list(seen)[:12]) + (" ..." if len(seen) > 12 else "")


def resolve_targets(model: nn.Module, targets: tuple[str, ...], *, label: str) -> list[str]:
    """The names of ``model``'s linear layers that ``targets`` select (see [Note: LoRA
    targets]); ``ConfigError`` naming the model's linear layers when an entry selects none."""
    layers = linear_layers(model)
    if not targets:
        raise ConfigError("--lora-targets is empty; give attn, mlp or module names")
    chosen: dict[str, None] = {}
    for target in targets:
        if target in LORA_GROUPS:
            hit = [n for n in layers if _in_group(n, target)]
        else:
            hit = [n for n in layers if _matches(n, target)]
        if not hit:
            raise ConfigError(
                f"--lora-targets {target!r} matches no linear layer of {label}; its linear "
                f"layers are: {_summary(list(layers)) or 'none'} (or use attn, mlp)"
            )
        chosen.update(dict.fromkeys(hit))
    return [n for n in layers if n in chosen]  # model order


def peft_target_modules(model: nn.Module, names: list[str]) -> list[str]:
    """The shortest module-name suffixes that select exactly ``names`` among ``model``'s
    linear layers (what ``LoraConfig(target_modules=...)`` gets); the full names when no
    suffix list does."""
    layers = list(linear_layers(model))
    want = set(names)
    for depth in (1, 2, 3):
        suffixes = list(dict.fromkeys(".".join(n.split(".")[-depth:]) for n in names))
        got = {n for n in layers if any(_matches(n, s) for s in suffixes)}
        if got == want:
            return suffixes
    return list(names)
