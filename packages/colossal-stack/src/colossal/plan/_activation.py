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
"""

from __future__ import annotations

from colossal_contracts import ConfigError

__all__ = ["RECOMPUTE", "layer_activation_bytes", "logits_bytes"]

RECOMPUTE = ("none", "selective", "full")


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
) -> float:
    """Bytes one rank stores for the backward pass of one layer (see [Note: activation formula]).

    ``tp_mode`` ``1d`` is Megatron's (``megatron_sp`` adds its sequence parallelism); ``2d``,
    ``2.5d`` and ``3d`` split everything by ``tp``. ``sp`` is ring/Ulysses context parallelism.
    """
    if recompute not in RECOMPUTE:
        raise ConfigError(f"recompute must be one of {RECOMPUTE}, got {recompute!r}")
    s, b, h, a, t = seq, batch, hidden, heads, tp
    split_all = megatron_sp or tp_mode != "1d"
    if recompute == "full":
        return 2 * s * b * h / (t if split_all else 1) / sp
    scores = 0.0 if recompute == "selective" else 5 * a * s / h
    if split_all:
        per = s * b * h / t * (34 + scores)
    else:
        per = s * b * h * (10 + 24 / t + scores / t)
    return per / sp


def logits_bytes(*, seq: int, batch: int, vocab: int, tp: int = 1, sp: int = 1) -> float:
    """Output layer and cross entropy: 16-bit logits and their fp32 copy, ``4 s b V / t`` (the
    paper's term, vocabulary-parallel)."""
    return 4 * seq * batch * vocab / tp / sp
