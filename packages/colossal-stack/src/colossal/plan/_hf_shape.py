"""The shape of a Hugging Face causal LM from its local ``config.json`` (nothing is downloaded).

[Note: hf shapes] transformers' ``AutoConfig`` reads the file and fills each architecture's
defaults; its attribute maps give every family ``hidden_size``, ``num_hidden_layers`` and
``num_attention_heads``. The rest is read per family: the MLP width and whether it is gated
(SwiGLU: three matrices, four saved activations of that width), the key/value heads, biases,
learned positions and whether the output matrix is the token embedding. Parameters are counted
from those sizes (exact for the families named in ``HF_FAMILIES``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from colossal_contracts import ConfigError
from colossal_models.hf import check_hf_sizes

from ._shape import ModelShape

__all__ = ["HF_FAMILIES", "hf_shape"]

# model_type: (gated MLP, biases in Linear layers, LayerNorm with bias, learned positions)
HF_FAMILIES: dict[str, tuple[bool, bool, bool, bool]] = {
    "gpt2": (False, True, True, True),
    "gpt_neox": (False, True, True, False),
    "opt": (False, True, True, True),
    "llama": (True, False, False, False),
    "mistral": (True, False, False, False),
    "qwen2": (True, False, False, False),
}


def _load(path: Path) -> Any:
    file = path / "config.json" if path.is_dir() else path
    if not file.is_file():
        raise ConfigError(
            f"--model hf:{path}: no config.json there; give a saved model folder or its "
            "config.json (nothing is downloaded)"
        )
    try:
        raw = json.loads(file.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"--model hf:{path}: {file.name} is not JSON ({e})") from None
    check_hf_sizes(raw, f"--model hf:{path}: {file.name}")
    kind = raw.get("model_type") if isinstance(raw, dict) else None
    if kind not in HF_FAMILIES:
        raise ConfigError(
            f"--model hf:{path}: model_type {kind!r} is not a supported causal LM; supported: "
            f"{', '.join(HF_FAMILIES)}"
        )
    try:
        from transformers import AutoConfig
    except ImportError:
        raise ConfigError(
            "--model hf:PATH reads the config with transformers; pip install transformers"
        ) from None
    try:
        return AutoConfig.for_model(**raw)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"--model hf:{path}: config.json does not load: {e}") from None


def _dropout(c: Any) -> float:
    for key in ("resid_pdrop", "hidden_dropout", "dropout"):
        value = getattr(c, key, None)
        if isinstance(value, int | float):
            return float(value)
    return 0.0


def hf_shape(path: str | Path) -> ModelShape:
    """The shape of the causal LM whose ``config.json`` is ``path`` (or is in folder ``path``)."""
    path = Path(path)
    c = _load(path)
    kind = c.model_type
    gated, bias, ln_bias, learned = HF_FAMILIES[kind]
    h, layers, heads = c.hidden_size, c.num_hidden_layers, c.num_attention_heads
    if kind == "gpt2":
        ffn = c.n_inner or 4 * h
    elif kind == "opt":
        ffn = c.ffn_dim
        bias = ln_bias = bool(getattr(c, "enable_bias", True))
    else:
        ffn = c.intermediate_size
    kv = getattr(c, "num_key_value_heads", None) or heads
    d = h // heads
    vocab = c.vocab_size
    positions = (
        c.max_position_embeddings if hasattr(c, "max_position_embeddings") else c.n_positions
    )
    tied = bool(getattr(c, "tie_word_embeddings", True))
    qkv_bias = bias or bool(getattr(c, "attention_bias", False)) or kind == "qwen2"
    attn = h * h + 2 * h * kv * d + h * h + (h + 2 * kv * d) * qkv_bias + h * bias
    mlp = (3 if gated else 2) * h * ffn + (ffn + h) * bias
    norm = h * (2 if ln_bias else 1)
    per_layer = attn + mlp + 2 * norm
    pos = (positions + (2 if kind == "opt" else 0)) * h if learned else 0
    embed = vocab * h * (1 if tied else 2) + pos
    params = layers * per_layer + embed + norm
    replicated = pos + layers * (2 * norm + 2 * h * bias) + norm
    name = f"hf-{kind}-{layers}x{h}"
    return ModelShape(
        name,
        layers,
        h,
        heads,
        vocab,
        params,
        embed,
        replicated,
        _dropout(c),
        ffn=ffn,
        kv_heads=kv,
        gated=gated,
        max_positions=positions,
        rmsnorm=gated,  # the Llama family's norm
    )
