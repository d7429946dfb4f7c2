"""Analytic counted bytes per mesh axis of one training step of GPT under a hybrid layout.

The bytes one rank counts per step ([Note: counted bytes] in colossal-parallel), averaged over the
ranks, built from colossal-parallel's per-layer formulas (``block_comm_bytes_1d``,
``linear_comm_bytes``, ``layernorm_comm_bytes``, ``embedding_comm_bytes``,
``cross_entropy_comm_bytes``, ``ring_attention_comm_bytes``, ``ulysses_comm_bytes``,
``pipeline_p2p_bytes``) plus the few model-boundary collectives they do not cover (the 1D
vocabulary-parallel embedding and head, the grid tied head, the loss scalars). fp32 throughout.

- dp: the gradients of the rank's parameters once (DDP's all-reduce), twice for ZeRO-1/2
  (reduce-scatter of gradients + all-gather of parameters, over ``dp_sp`` with sequence
  parallelism). Gemini's own dp collectives are not the mesh's: None.
- tp: every block's activations (1D with or without Megatron sequence parallelism, or the grid
  modes' Linears and LayerNorms), the embeddings, the head and the vocabulary-parallel loss.
- pp: each micro-batch's boundary activation and its gradient, counted by the sender *and* the
  receiver (``send`` + ``recv``), the tied embedding's gradient swapped between the first and
  last stage, and the loss broadcast.
- sp: ring attention's key/value blocks (point-to-point, so also counted twice) or Ulysses'
  all-to-alls, every layer; the loss's sum over sp; without ZeRO/Gemini the gradients' sum.
"""

from __future__ import annotations

import math
from typing import Any

from colossal_models import GPTConfig
from colossal_parallel.grid import (
    cross_entropy_comm_bytes,
    embedding_comm_bytes,
    layernorm_comm_bytes,
    linear_comm_bytes,
)
from colossal_parallel.pipeline import pipeline_p2p_bytes
from colossal_parallel.sequence import ring_attention_comm_bytes, ulysses_comm_bytes
from colossal_parallel.tp1d import block_comm_bytes_1d

__all__ = ["formula_bytes", "local_params_1d"]

E = 4  # fp32 bytes per element
SCALAR = 4  # one fp32 loss


def local_params_1d(cfg: GPTConfig, tp: int, blocks: float, *, first: bool, last: bool) -> float:
    """Parameters one rank holds under 1D tp: ``blocks`` blocks; on the ``first`` stage the
    token embedding (its vocabulary rows) and the position table; on the ``last`` the tied
    embedding (for the head, unless it is also the first) and ``ln_f``."""
    h, f, b = cfg.hidden_size, cfg.ffn_size, int(cfg.bias)
    block = (3 * h * h + h * h + 2 * f * h) / tp + b * (3 * h + f) / tp + b * 2 * h
    block += 2 * (1 + b) * h  # ln1, ln2 (replicated)
    n = blocks * block
    if first or last:
        n += cfg.vocab_size * h / tp
    if first:
        n += cfg.max_seq_len * h
    if last:
        n += (1 + b) * h
    return n


def _mean_params(cfg: GPTConfig, tp: int, pp: int) -> float:
    """Mean over the pp stages of the parameters one rank holds (1D tp or none)."""
    blocks = cfg.num_layers / pp
    return (
        sum(local_params_1d(cfg, tp, blocks, first=i == 0, last=i == pp - 1) for i in range(pp))
        / pp
    )


def _tp_1d(cfg: GPTConfig, tp: int, tokens: int, megatron: bool) -> float:
    """Counted tp bytes of the whole model on ``tokens`` rows (all micro-batches of a rank)."""
    h = cfg.hidden_size
    f, b = block_comm_bytes_1d(
        tokens, h, tp, sequence_parallel=megatron, bias=cfg.bias, dtype_bytes=E
    )
    n = cfg.num_layers * (f + b)
    n += tokens * h * E  # vocabulary-parallel embedding: partial lookups all-reduced
    n += 3 * tokens * E  # vocab-parallel cross entropy: max, target logit, sum of exp
    if megatron:
        # enter: split (backward all-gather); head: all-gather, backward reduce-scatter;
        # ln_f's weight and bias gradients summed
        n += 3 * tokens * h * E + (1 + int(cfg.bias)) * h * E
    else:
        n += tokens * h * E  # head input copied to tp: backward all-reduce
    return n


def _tp_grid(cfg: GPTConfig, mode: str, q: int, tokens: int, batch: int, seq: int) -> float:
    """Counted tp bytes of the whole model under 2D/2.5D/3D (``tokens`` = ``batch * seq``)."""
    h, f = cfg.hidden_size, cfg.ffn_size
    n = 0.0
    for k, out in ((h, 3 * h), (h, h), (h, f), (f, h)):
        c = linear_comm_bytes(mode, q, tokens=tokens, in_features=k, out_features=out)
        n += cfg.num_layers * c.total
    ln = layernorm_comm_bytes(mode, q, tokens=tokens, hidden=h).total
    n += (2 * cfg.num_layers + 1) * ln
    n += embedding_comm_bytes(mode, q, num_embeddings=cfg.vocab_size, dim=h).total
    n += embedding_comm_bytes(mode, q, num_embeddings=cfg.max_seq_len, dim=h).total
    # [Note: grid tied head]: the (V, h/q) weight block gathered (gradient reduce-scattered),
    # partial logits of this rank's rows reduce-scattered over the vocabulary (all-gathered back)
    n += 2 * cfg.vocab_size * h / q * E + 2 * (batch / q) * seq * cfg.vocab_size * E
    n += cross_entropy_comm_bytes(mode, q, tokens=tokens).total
    return n


def formula_bytes(
    cfg: GPTConfig, plugin: str, settings: dict[str, Any], *, world: int, batch: int, seq: int
) -> dict[str, float | None]:
    """Mean counted bytes per rank and step on each axis of size > 1 (None: not counted)."""
    s = settings
    tp, pp = s.get("tp_size", 1), s.get("pp_size", 1)
    kinds = (s.get("sequence_parallel") or "").split("+")  # "ring+megatron": both
    sp_kind = kinds[0] if kinds[0] in ("ring", "ulysses") else None
    megatron = "megatron" in kinds
    sp = s.get("sp_size", 1) if sp_kind else 1
    m, v = s.get("microbatches", 1), 1
    if pp > 1 and s.get("schedule") == "interleaved":
        v = s.get("num_virtual", 0) or 2
    zero, gemini = s.get("zero_stage", 0), plugin == "gemini"
    dp = world // (tp * pp * sp)
    b = batch // dp  # rows of one dp coordinate
    tokens = b * seq // sp  # rows a tp group computes per step
    tp_mode = s.get("tp_mode", "1d")
    out: dict[str, float | None] = {}
    grid = tp_mode != "1d"
    params = 0.0 if grid else _mean_params(cfg, tp, pp)
    if dp > 1 or (zero and dp * sp > 1):
        out["dp"] = None if gemini else params * E * (2 if zero else 1)
    elif zero:
        out["dp"] = 0.0  # ZeRO reports its (empty) dp counter on one dp rank
    if grid and (tp_mode != "2d" or pp > 1):
        raise ValueError(f"the formulas cover 1d tp, and 2d without pp; got {tp_mode} x pp{pp}")
    if tp > 1:
        if grid:
            out["tp"] = _tp_grid(cfg, tp_mode, math.isqrt(tp), tokens, b, seq)
        else:
            out["tp"] = _tp_1d(cfg, tp, tokens, megatron) / pp
    if pp > 1:
        seq_parts = sp * (tp if megatron else 1)  # ranks sharing the boundary's sequence
        numel = (b // m) * (seq // seq_parts) * cfg.hidden_size  # one micro-batch's boundary
        stages = pp * v
        sent = sum(pipeline_p2p_bytes(i, stages, m, numel, elem_bytes=E) for i in range(stages))
        tied = 2 * 2 * cfg.vocab_size // tp * cfg.hidden_size * E  # send + recv, 2 ranks
        out["pp"] = (2 * sent + tied) / pp + SCALAR
    if sp > 1:
        heads, hd = cfg.num_heads // tp, cfg.hidden_size // cfg.num_heads
        if sp_kind == "ring":  # point-to-point: counted by sender and receiver
            f, bw = ring_attention_comm_bytes(b, heads, seq, hd, sp, elem_bytes=E)
            per_layer = 2 * (f + bw)
        else:
            f, bw = ulysses_comm_bytes(b, heads, seq, hd, sp, elem_bytes=E)
            per_layer = f + bw
        n = cfg.num_layers * per_layer + m * SCALAR  # the loss summed over sp per micro-batch
        if not zero and not gemini:
            n += pp * params * E  # gradients summed over sp (mean over stages: / pp below)
        out["sp"] = n / pp
    return out
