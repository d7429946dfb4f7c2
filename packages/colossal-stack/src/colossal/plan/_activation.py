"""Activation bytes per transformer layer: Korthikanti et al. 2022, "Reducing Activation
Recomputation in Large Transformer Models" (Section 4), with the split of each parallel mode.

[Note: activation formula] With 16-bit activations and 1-byte dropout masks one layer stores
``s b h (34 + 5 a s / h)`` bytes: 11 sbh + 5 a s^2 b in attention, 19 sbh in the MLP, 4 sbh in the
two LayerNorms. Megatron tensor parallelism of size t splits all but the 10 sbh around the
LayerNorms and dropouts: ``s b h (10 + 24/t + 5 a s/(h t))``; with sequence parallelism everything
is split: ``s b h/t (34 + 5 a s/h)``. Selective recomputation (or fused attention that saves no
scores) drops the ``5 a s/h`` term; full recomputation keeps the layer input only, ``2 s b h``
(split by t under sequence parallelism). The 2D/2.5D/3D modes split every activation over all t
ranks (rows by batch x sequence, columns by hidden), so they count as ``sequence-split``.
Context parallelism (ring/Ulysses) of size ``sp`` divides every term by sp (each rank holds s/sp
tokens and its heads' scores over them only).

[Note: runtime activations] The same count in elements: a layer saves 16 activations of ``s b h``
elements (the two LayerNorm inputs, the qkv and fc inputs, q, k, v and the projection's input, the
GELU's input and output, 4 sbh each), of which 12 are split by Megatron tensor parallelism, plus
two 1-byte dropout masks; the paper's 34 sbh is that at 2 bytes per element. Colossal's models
call ``scaled_dot_product_attention``, which on a GPU runs a fused kernel that saves no scores (its
dropout mask is regenerated from the seed) but saves the fp32 log-sum-exp per head and row
(``4 a s b``), and the LayerNorms save fp32 mean and rstd per row (``16 s b`` for two): the
``attention="fused"`` count, which the planner uses; ``"math"`` is the paper's. Measured on the
CPU's fused kernel (dropout 0) at fp32 and bf16, one GPT block saves exactly this. The grid
modes' LayerNorm is built from autograd operations and saves two tensors (the centred input and
its normalised form) instead of one: two more split activations per layer. Under Megatron's
sequence parallelism the runtime's column-parallel layers all-gather their input and
``F.linear`` saves it, so the qkv and fc inputs (and the head's) stay whole, where Megatron-LM
saves the split one and gathers it again in backward: ``4 sbh`` more per layer than the paper's
``34 sbh / t`` at 16 bits (measured: plan_vs_measured's tp2-sp row was 10% low without it).
"""

from __future__ import annotations

from colossal_contracts import ConfigError

__all__ = [
    "ATTENTION",
    "RECOMPUTE",
    "head_activation_bytes",
    "layer_activation_bytes",
    "layer_backward_bytes",
    "logits_bytes",
]

RECOMPUTE = ("none", "selective", "full")
ATTENTION = ("math", "fused")


def layer_activation_bytes(
    *,
    seq: int,
    batch: int,
    hidden: int,
    heads: int,
    tp: int = 1,
    tp_mode: str = "1d",
    megatron_sp: bool = False,
    sp: int = 1,
    recompute: str = "none",
    attention: str = "math",
    act_bytes: int = 2,
    dropout: bool = True,
    ffn: int = 0,
    kv_heads: int = 0,
    gated: bool = False,
    norm_tensors: int = 1,
) -> float:
    """Bytes one rank stores for the backward pass of one layer (see [Note: activation formula]
    and [Note: runtime activations]; the defaults are the paper's count).

    ``tp_mode`` ``1d`` is Megatron's (``megatron_sp`` adds its sequence parallelism); ``2d``,
    ``2.5d`` and ``3d`` split everything by ``tp``. ``sp`` is ring/Ulysses context parallelism.
    ``act_bytes`` is the bytes of one activation element (2 for 16-bit, 4 for fp32). ``ffn``
    (0: ``4 h``), ``kv_heads`` (0: ``heads``) and ``gated`` (SwiGLU saves the gate, its SiLU, the
    up projection and their product: four ``ffn``-wide tensors, against the GELU MLP's two)
    generalise the split part ``12 sbh`` to ``(2 + 2 kv/a + (4 or 2) ffn/h) sbh``; the fused count
    keeps ``kv = a``, since the runtime repeats shared key/value heads for the kernel, which saves
    the copies. ``norm_tensors``: tensors each of the two norms saves (1 for ``nn.LayerNorm``; 2
    for a norm built from autograd operations: the grid modes' LayerNorm, and ``nn.RMSNorm`` as
    measured on this torch).
    """
    if recompute not in RECOMPUTE:
        raise ConfigError(f"recompute must be one of {RECOMPUTE}, got {recompute!r}")
    if attention not in ATTENTION:
        raise ConfigError(f"attention must be one of {ATTENTION}, got {attention!r}")
    s, b, h, a, t, e = seq, batch, hidden, heads, tp, act_bytes
    split_all = megatron_sp or tp_mode != "1d"
    rep = t if split_all else 1  # how the replicated part is divided
    sbh = s * b * h
    if recompute == "full":
        return e * sbh / rep / sp
    masks = 2 if dropout else 0
    f = (ffn or 4 * h) / h
    kv = 1.0 if attention == "fused" else (kv_heads or a) / a
    split = 2 + 2 * kv + (4 if gated else 2) * f
    # the qkv and fc inputs: under the runtime's Megatron SP the column layer's F.linear saves
    # its all-gathered input, whole ([Note: runtime activations])
    gathered = megatron_sp and tp_mode == "1d" and attention == "fused"
    inputs = 2 * e * sbh / (1 if gathered else rep)
    per = (2 * norm_tensors * e + masks) * sbh / rep + inputs + split * e * sbh / t
    if attention == "math":
        if recompute != "selective":
            per += a * s * s * b * ((2 * e + 1) if dropout else e) / t
    else:
        per += 4 * a * s * b / t + 16 * s * b / rep
    return per / sp


def layer_backward_bytes(
    *,
    seq: int,
    batch: int,
    hidden: int,
    tp: int = 1,
    split_all: bool = False,
    sp: int = 1,
    act_bytes: int = 2,
    ffn: int = 0,
) -> float:
    """The working set of one layer's backward pass beyond its saved activations: the incoming
    gradient (``e s b h``) and, in the MLP, the gradient of the GELU's output and of its input
    alive together while the GELU's output is freed (net ``e s b ffn / t``, ``ffn`` 0: ``4 h``)."""
    sbh, e = seq * batch * hidden / sp, act_bytes
    f = (ffn or 4 * hidden) / hidden
    return e * sbh / (tp if split_all else 1) + f * e * sbh / tp


def logits_bytes(*, seq: int, batch: int, vocab: int, tp: int = 1, sp: int = 1) -> float:
    """Output layer and cross entropy: 16-bit logits and their fp32 copy, ``4 s b V / t`` (the
    paper's term, vocabulary-parallel)."""
    return 4 * seq * batch * vocab / tp / sp


def head_activation_bytes(
    *,
    seq: int,
    batch: int,
    hidden: int,
    vocab: int,
    tp: int = 1,
    tp_mode: str = "1d",
    megatron_sp: bool = False,
    grid_q: int = 1,
    sp: int = 1,
    act_bytes: int = 2,
    norm_tensors: int = 1,
) -> float:
    """The runtime's output layer and loss at the peak, the start of the backward pass: the final
    LayerNorm's input and output (the head's input), its fp32 statistics, the fp32
    log-probabilities cross entropy saves (``4 s b V/t``, vocabulary-parallel) and, as backward
    starts, their gradient and the logits' gradient in fp32 (``8 s b V/t``); plus the int64 token
    ids and targets (``16 s b``); ``norm_tensors`` as in ``layer_activation_bytes``. Megatron's vocabulary-parallel loss also holds the 16-bit logits
    beside their fp32 copy (``2 s b V/t``). The grid modes (``tp_mode`` 2d/2.5d/3d, grid axis
    ``grid_q``) compute partial logits over the whole vocabulary for the rank's rows and hand a
    contiguous copy to the reduce-scatter (``2 e s b V/q``), and gather the tied weight's columns
    (``e V h/q``)."""
    s, b, e, V, h = seq / sp, batch, act_bytes, vocab, hidden
    grid = tp_mode != "1d"
    split = tp if (grid or megatron_sp) else 1
    ln = ((1 + norm_tensors) * e * h + 8) * s * b / split
    if megatron_sp and not grid:  # the head saves its all-gathered input, whole
        ln += e * h * s * b * (1 - 1 / split)
    logits = 12 * s * b * V / tp
    if grid:
        logits += 2 * e * s * b * V / grid_q + e * V * h / grid_q
    elif tp > 1 and e < 4:
        logits += 2 * s * b * V / tp
    return ln + logits + 16 * s * b
