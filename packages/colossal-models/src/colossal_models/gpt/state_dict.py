"""State-dict adapter between ``GPT`` and Hugging Face ``GPT2LMHeadModel``.

HF GPT-2 stores its Linear layers as ``Conv1D`` with weights ``(in, out)`` (ours are ``nn.Linear``,
``(out, in)``: transposed), and fuses q, k and v into ``c_attn`` in the same order as our ``qkv``.
Its ``lm_head`` is tied to ``wte`` and is not stored on our side. The mapping is exact, so logits
agree to float rounding. Only ``transformers``' config class needs the ``hf`` extra; the tensor
mapping works on any ``Mapping[str, Tensor]`` (e.g. one read with safetensors).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from colossal_contracts import ConfigError

from .._hf import check_keys, hf_attr, import_transformers
from .config import GPTConfig

__all__ = ["GPT2StateDictAdapter"]

# ours -> HF, per block; the transposed ones are Conv1D weights.
_BLOCK = {
    "ln1.weight": "ln_1.weight",
    "ln1.bias": "ln_1.bias",
    "attn.qkv.weight": "attn.c_attn.weight",
    "attn.qkv.bias": "attn.c_attn.bias",
    "attn.proj.weight": "attn.c_proj.weight",
    "attn.proj.bias": "attn.c_proj.bias",
    "ln2.weight": "ln_2.weight",
    "ln2.bias": "ln_2.bias",
    "mlp.fc.weight": "mlp.c_fc.weight",
    "mlp.fc.bias": "mlp.c_fc.bias",
    "mlp.proj.weight": "mlp.c_proj.weight",
    "mlp.proj.bias": "mlp.c_proj.bias",
}
_TRANSPOSED = {"attn.qkv.weight", "attn.proj.weight", "mlp.fc.weight", "mlp.proj.weight"}
_TOP = {
    "wte.weight": "transformer.wte.weight",
    "wpe.weight": "transformer.wpe.weight",
    "ln_f.weight": "transformer.ln_f.weight",
    "ln_f.bias": "transformer.ln_f.bias",
}
_HF_BUFFERS = (".attn.bias", ".attn.masked_bias")  # causal-mask buffers of older transformers


class GPT2StateDictAdapter:
    """Converts state dicts between ``GPT(config)`` and ``GPT2LMHeadModel`` of the same shape."""

    config: GPTConfig

    def __init__(self, config: GPTConfig) -> None:
        if not config.bias:
            raise ConfigError(
                "GPT-2 has biases in every Linear and LayerNorm; use a GPTConfig with bias=True"
            )
        self.config = config

    def _pairs(self) -> list[tuple[str, str, bool]]:
        """(our key, HF key, transposed) for every tensor."""
        pairs = [(ours, hf, False) for ours, hf in _TOP.items()]
        for i in range(self.config.num_layers):
            for ours, hf in _BLOCK.items():
                pairs.append((f"blocks.{i}.{ours}", f"transformer.h.{i}.{hf}", ours in _TRANSPOSED))
        return pairs

    def key_map(self) -> dict[str, str]:
        """Our state-dict name -> ``GPT2LMHeadModel``'s, for every stored tensor (a Conv1D
        weight is the transpose of ours; ``lm_head.weight`` is tied to ``wte`` and not named)."""
        return {ours: hf for ours, hf, _ in self._pairs()}

    def from_hf(self, hf_state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Our state dict from a ``GPT2LMHeadModel`` (or ``GPT2Model`` with prefix) state dict."""
        pairs = self._pairs()
        check_keys(
            (k for k in hf_state if k != "lm_head.weight"),
            {hf for _, hf, _ in pairs},
            what="GPT2StateDictAdapter.from_hf",
            ignore=_HF_BUFFERS,
        )
        if "lm_head.weight" in hf_state and not torch.equal(
            hf_state["lm_head.weight"], hf_state["transformer.wte.weight"]
        ):
            raise ConfigError(
                "GPT2StateDictAdapter.from_hf: lm_head is not tied to wte, but GPT ties them; "
                "convert a model with tie_word_embeddings=True"
            )
        return {
            ours: (hf_state[hf].t() if t else hf_state[hf]).contiguous() for ours, hf, t in pairs
        }

    def to_hf(self, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A ``GPT2LMHeadModel`` state dict (with the tied ``lm_head.weight``) from ours."""
        pairs = self._pairs()
        check_keys(state, {ours for ours, _, _ in pairs}, what="GPT2StateDictAdapter.to_hf")
        out = {hf: (state[ours].t() if t else state[ours]).contiguous() for ours, hf, t in pairs}
        out["lm_head.weight"] = out["transformer.wte.weight"]
        return out

    @staticmethod
    def config_from_hf(hf_config: Any) -> GPTConfig:
        """Our config from a ``transformers.GPT2Config`` (read by attribute; no import needed)."""
        act = hf_attr(hf_config, "activation_function", "gelu_new")
        if act not in ("gelu_new", "gelu_pytorch_tanh"):
            raise ConfigError(
                f"GPT uses the tanh GELU ('gelu_new'); this GPT-2 config uses {act!r}"
            )
        for flag in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
            if hf_attr(hf_config, flag, False):
                raise ConfigError(f"GPT2 option {flag}=True has no equivalent in GPT; turn it off")
        if not hf_attr(hf_config, "scale_attn_weights", True):
            raise ConfigError("GPT2 scale_attn_weights=False has no equivalent in GPT")
        return GPTConfig(
            vocab_size=hf_config.vocab_size,
            max_seq_len=hf_config.n_positions,
            num_layers=hf_config.n_layer,
            num_heads=hf_config.n_head,
            hidden_size=hf_config.n_embd,
            ffn_hidden_size=hf_attr(hf_config, "n_inner"),
            dropout=float(hf_attr(hf_config, "resid_pdrop", 0.0)),
            bias=True,
            layer_norm_eps=float(hf_attr(hf_config, "layer_norm_epsilon", 1e-5)),
        )

    def config_to_hf(self, **overrides: Any) -> Any:
        """A ``transformers.GPT2Config`` of this shape (needs the ``hf`` extra)."""
        c = self.config
        kwargs: dict[str, Any] = dict(
            vocab_size=c.vocab_size,
            n_positions=c.max_seq_len,
            n_layer=c.num_layers,
            n_head=c.num_heads,
            n_embd=c.hidden_size,
            n_inner=c.ffn_hidden_size,
            activation_function="gelu_new",
            resid_pdrop=c.dropout,
            embd_pdrop=c.dropout,
            attn_pdrop=c.dropout,
            layer_norm_epsilon=c.layer_norm_eps,
            tie_word_embeddings=True,
        )
        if c.vocab_size <= 50256:  # GPT-2's end-of-text id is past a smaller vocabulary
            kwargs.update(bos_token_id=None, eos_token_id=None)
        kwargs.update(overrides)
        return import_transformers().GPT2Config(**kwargs)
