"""The shape of a transformer as the planner sees it, read from a colossal-models preset."""

from __future__ import annotations

from dataclasses import dataclass

from colossal_contracts import ConfigError
from colossal_models import GPTConfig, PaLMConfig

__all__ = ["ModelShape", "from_gpt_config", "from_palm_config", "gpt_shape", "model_shape"]


@dataclass(frozen=True)
class ModelShape:
    """Sizes of a decoder-only transformer.

    Attributes:
        name: ``family-preset``.
        layers, hidden, heads, vocab: L, h, a, V of Korthikanti et al.
        params: exact parameter count (colossal-models' ``num_params``).
        embed_params: parameters of the embeddings (on the first pipeline stage; tied head).
        replicated_params: parameters Megatron tensor parallelism does not split (learned
            positions, LayerNorms, row-parallel biases).
        dropout: the dropout probability (> 0 stores 1-byte masks).
        ffn, kv_heads, gated: the MLP width (0: ``4 h``), key/value heads (0: ``heads``) and a
            gated (SwiGLU) MLP.
        max_positions: the longest sequence the model takes (0: unknown).
        rmsnorm: the norms are RMSNorm (they save two tensors, see ``layer_activation_bytes``).
        frozen: parameters that do not train (``requires_grad=False``: a LoRA run's base,
            see ``colossal.plan.lora_shape``); they cost their compute-precision bytes only,
            with no gradient, fp32 master or Adam state (0: every parameter trains).
    """

    name: str
    layers: int
    hidden: int
    heads: int
    vocab: int
    params: int
    embed_params: int
    replicated_params: int = 0
    dropout: float = 0.0
    ffn: int = 0
    kv_heads: int = 0
    gated: bool = False
    max_positions: int = 0
    rmsnorm: bool = False
    frozen: int = 0

    @property
    def trainable(self) -> int:
        """Parameters that train."""
        return self.params - self.frozen

    @property
    def layer_params(self) -> float:
        """Parameters of one transformer block (all blocks are alike)."""
        return (self.params - self.embed_params) / self.layers

    def forward_flops_per_token(self, seq_len: int) -> float:
        """Model FLOPs of the forward pass per token: ``2N + 4 L h s`` (a GEMM per weight, and
        the attention scores and their use)."""
        return 2.0 * self.params + 4.0 * self.layers * self.hidden * seq_len

    def flops_per_token(self, seq_len: int) -> float:
        """Model FLOPs of forward + backward per token: ``6N - 2F + 12 L h s`` (Narayanan et
        al. 2021 without the logit term, which ``6N`` already holds). Backward runs, for every
        weight, the input-gradient GEMM (``2N``) and, for trainable ones only, the
        weight-gradient GEMM (``2(N - F)``): a frozen layer's backward costs about its
        forward, a trainable one's twice that. ``F = 0``: the usual ``6N + 12 L h s``."""
        return 6.0 * self.params - 2.0 * self.frozen + 12.0 * self.layers * self.hidden * seq_len


def from_gpt_config(g: GPTConfig, name: str) -> ModelShape:
    """The shape of ``GPT(g)`` (tied head)."""
    h, bias = g.hidden_size, int(g.bias)
    embed = (g.vocab_size + g.max_seq_len) * h
    replicated = g.max_seq_len * h + g.num_layers * (4 * h + 2 * h) * bias + 2 * h
    if not bias:
        replicated = g.max_seq_len * h + g.num_layers * 2 * h + h
    return ModelShape(
        name,
        g.num_layers,
        h,
        g.num_heads,
        g.vocab_size,
        g.num_params(),
        embed,
        replicated,
        g.dropout,
        ffn=g.ffn_size,
        max_positions=g.max_seq_len,
    )


def from_palm_config(p: PaLMConfig, name: str) -> ModelShape:
    """The shape of ``PaLM(p)`` (its parallel block is counted as the sequential one)."""
    return ModelShape(
        name,
        p.num_layers,
        p.hidden_size,
        p.num_heads,
        p.vocab_size,
        p.num_params(),
        p.vocab_size * p.hidden_size * (1 if p.tie_embeddings else 2),
        p.num_layers * 2 * p.hidden_size + p.hidden_size,
        ffn=p.ffn_size,
        kv_heads=p.num_kv_heads,
        gated=True,
        max_positions=p.max_seq_len,
        rmsnorm=p.norm == "rmsnorm",
    )


def gpt_shape(layers: int, hidden: int, heads: int, *, seq_len: int = 2048) -> ModelShape:
    """A GPT of any size (GPT-2 vocabulary, ``seq_len`` learned positions), e.g. for a search of the
    largest model that fits."""
    g = GPTConfig(max_seq_len=seq_len, num_layers=layers, num_heads=heads, hidden_size=hidden)
    return from_gpt_config(g, f"gpt-{layers}x{hidden}")


def model_shape(family: str, preset: str) -> ModelShape:
    """The shape of colossal-models' ``family`` (gpt or palm) preset ``preset``, or of the
    Hugging Face causal LM ``hf:PATH`` (a local ``config.json`` or saved folder; no preset)."""
    if family.startswith("hf:"):
        from ._hf_shape import hf_shape

        return hf_shape(family[3:])
    if family == "gpt":
        return from_gpt_config(GPTConfig.preset(preset), f"gpt-{preset}")
    if family == "palm":
        name = preset if preset.startswith(("palm", "llama")) else f"palm-{preset}"
        return from_palm_config(PaLMConfig.preset(preset), name)
    raise ConfigError(
        f"unknown --model {family!r}; choose gpt, palm or hf:PATH (a local config.json or a saved "
        "model folder)"
    )
