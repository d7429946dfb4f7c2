"""State-dict adapter between the Llama-shaped members of the PaLM family and Hugging Face
``LlamaForCausalLM``.

[Note: what maps] Llama and PaLM share rotary positions (both in the "rotate half" layout here, so
q and k need no permutation), SwiGLU, bias-free Linears, and key/value heads that may be fewer than
query heads (Llama's ``num_key_value_heads``; PaLM's multi-query attention is the case 1). They
differ in two things a state dict cannot hide: a PaLM block computes attention and MLP in parallel
from one LayerNorm, a Llama block runs them one after the other with an RMSNorm before each. So a
config maps exactly when ``parallel_block=False`` and ``norm="rmsnorm"``; ``num_kv_heads`` (1 or
more) and ``tie_embeddings`` (True or False) map to ``num_key_value_heads`` and
``tie_word_embeddings``. A PaLM proper (parallel block, LayerNorm) is refused with ``ConfigError``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from colossal_contracts import ConfigError

from .._hf import check_keys, hf_attr, import_transformers
from .config import PaLMConfig

__all__ = ["LlamaStateDictAdapter"]

_BLOCK = {
    "ln1.weight": "input_layernorm.weight",
    "ln2.weight": "post_attention_layernorm.weight",
    "attn.q.weight": "self_attn.q_proj.weight",
    "attn.k.weight": "self_attn.k_proj.weight",
    "attn.v.weight": "self_attn.v_proj.weight",
    "attn.proj.weight": "self_attn.o_proj.weight",
    "mlp.gate.weight": "mlp.gate_proj.weight",
    "mlp.up.weight": "mlp.up_proj.weight",
    "mlp.proj.weight": "mlp.down_proj.weight",
}
_TOP = {"wte.weight": "model.embed_tokens.weight", "ln_f.weight": "model.norm.weight"}
_HEAD = "lm_head.weight"


class LlamaStateDictAdapter:
    """Converts state dicts between ``PaLM(config)`` and ``LlamaForCausalLM`` of the same shape.

    ``config`` must be Llama-shaped (see [Note: what maps]); otherwise ``ConfigError``.
    """

    config: PaLMConfig

    def __init__(self, config: PaLMConfig) -> None:
        if config.parallel_block or config.norm != "rmsnorm":
            raise ConfigError(
                "LlamaStateDictAdapter: only Llama-shaped configs map onto LlamaForCausalLM "
                f"(got parallel_block={config.parallel_block}, norm={config.norm!r}); a PaLM "
                "block computes attention and MLP from one LayerNorm, a Llama block applies them "
                "in turn with two RMSNorms. Use PaLMConfig(parallel_block=False, norm='rmsnorm')"
            )
        self.config = config

    def _pairs(self) -> list[tuple[str, str]]:
        pairs = list(_TOP.items())
        for i in range(self.config.num_layers):
            pairs += [(f"blocks.{i}.{o}", f"model.layers.{i}.{h}") for o, h in _BLOCK.items()]
        if not self.config.tie_embeddings:
            pairs.append(("lm_head.weight", _HEAD))
        return pairs

    def key_map(self) -> dict[str, str]:
        """Our state-dict name -> ``LlamaForCausalLM``'s, for every stored tensor (same
        layout: no tensor is transposed or permuted)."""
        return dict(self._pairs())

    def from_hf(self, hf_state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Our state dict from a ``LlamaForCausalLM`` state dict."""
        pairs = self._pairs()
        tied = self.config.tie_embeddings
        names = (k for k in hf_state if not (tied and k == _HEAD))
        check_keys(names, {h for _, h in pairs}, what="LlamaStateDictAdapter.from_hf")
        embed = hf_state["model.embed_tokens.weight"]
        if tied and _HEAD in hf_state and not torch.equal(hf_state[_HEAD], embed):
            raise ConfigError(
                "LlamaStateDictAdapter.from_hf: the config ties embeddings but lm_head "
                "differs from embed_tokens; use tie_embeddings=False"
            )
        return {o: hf_state[h].contiguous() for o, h in pairs}

    def to_hf(self, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A ``LlamaForCausalLM`` state dict from ours (``lm_head.weight`` included when tied)."""
        pairs = self._pairs()
        check_keys(state, {o for o, _ in pairs}, what="LlamaStateDictAdapter.to_hf")
        out = {h: state[o].contiguous() for o, h in pairs}
        if self.config.tie_embeddings:
            out[_HEAD] = out["model.embed_tokens.weight"]
        return out

    @staticmethod
    def config_from_hf(hf_config: Any) -> PaLMConfig:
        """Our config from a ``transformers.LlamaConfig`` (read by attribute; no import needed)."""
        rope = hf_attr(hf_config, "rope_parameters", None) or hf_attr(
            hf_config, "rope_scaling", None
        )
        rope = dict(rope or {})
        if rope.get("rope_type", rope.get("type", "default")) != "default":
            raise ConfigError(
                f"Llama rope scaling {rope.get('rope_type')!r} is not supported; only the default "
                "rotary embedding maps onto PaLM"
            )
        if hf_attr(hf_config, "hidden_act", "silu") != "silu":
            raise ConfigError("Llama hidden_act must be 'silu' to map onto SwiGLU")
        if hf_attr(hf_config, "attention_bias", False) or hf_attr(hf_config, "mlp_bias", False):
            raise ConfigError("Llama with attention_bias or mlp_bias has no PaLM equivalent")
        heads = hf_config.num_attention_heads
        theta = rope.get("rope_theta", hf_attr(hf_config, "rope_theta", 10000.0))
        return PaLMConfig(
            vocab_size=hf_config.vocab_size,
            max_seq_len=hf_config.max_position_embeddings,
            num_layers=hf_config.num_hidden_layers,
            num_heads=heads,
            num_kv_heads=hf_attr(hf_config, "num_key_value_heads", heads),
            hidden_size=hf_config.hidden_size,
            head_dim=hf_attr(hf_config, "head_dim", hf_config.hidden_size // heads),
            ffn_hidden_size=hf_config.intermediate_size,
            parallel_block=False,
            norm="rmsnorm",
            norm_eps=float(hf_attr(hf_config, "rms_norm_eps", 1e-6)),
            tie_embeddings=bool(hf_attr(hf_config, "tie_word_embeddings", False)),
            rope_theta=float(theta),
        )

    def config_to_hf(self, **overrides: Any) -> Any:
        """A ``transformers.LlamaConfig`` of this shape (needs the ``hf`` extra)."""
        c = self.config
        kwargs: dict[str, Any] = dict(
            vocab_size=c.vocab_size,
            max_position_embeddings=c.max_seq_len,
            num_hidden_layers=c.num_layers,
            num_attention_heads=c.num_heads,
            num_key_value_heads=c.num_kv_heads,
            hidden_size=c.hidden_size,
            head_dim=c.head_size,
            intermediate_size=c.ffn_size,
            rms_norm_eps=c.norm_eps,
            tie_word_embeddings=c.tie_embeddings,
            rope_theta=c.rope_theta,
            hidden_act="silu",
            attention_bias=False,
            mlp_bias=False,
        )
        kwargs.update(overrides)
        return import_transformers().LlamaConfig(**kwargs)
