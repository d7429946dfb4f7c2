"""Choosing the chunk size of chunked inference ([Note: chunked inference]) from a byte budget.

The largest temporaries of an Evoformer block are the attention weights and the widened
transition activations, and chunking bounds them: each is a fixed number of bytes per slice row
(an MSA row, a residue row or column) times the chunk size. ``chunk_bytes_per_row`` gives that
number for the worst of them; ``chunk_size_for_budget`` divides a budget by it. The budget is for
the chunked temporaries only: the representations themselves (m, z, their residual updates and
the whole-tensor projections the slices read, such as LayerNorm(z) and the triangular updates'
other operand) come on top (the evoformer benchmark measures whole peaks with the live-tensor
tracer).
"""

from __future__ import annotations

from colossal_contracts import ConfigError

from .config import EvoformerConfig

__all__ = ["chunk_bytes_per_row", "chunk_size_for_budget"]


def chunk_bytes_per_row(
    cfg: EvoformerConfig, *, batch: int, num_seq: int, num_res: int, elem_bytes: int = 4
) -> dict[str, int]:
    """Bytes of the largest temporaries of each chunked operation, per slice row.

    Attention: logits and their softmax, ``2 * heads * L * L`` per row of L keys. Transitions:
    the widened activation before and after the ReLU. Outer product mean: the (J, C, C) outer
    products of one residue i and their flattened copy. Triangular update: one row (or column)
    of its own projection, the product, the normed product, the gate and output.
    """
    B, S, R, e = batch, num_seq, num_res, elem_bytes
    n = cfg.transition_n
    return {
        "msa_row_attention": 2 * B * cfg.msa_heads * R * R * e,  # per MSA row
        "msa_column_attention": 2 * B * cfg.msa_heads * S * S * e,  # per residue column
        "triangle_attention": 2 * B * cfg.pair_heads * R * R * e,  # per residue row
        "msa_transition": 2 * B * R * n * cfg.c_m * e,  # per MSA row
        "pair_transition": 2 * B * R * n * cfg.c_z * e,  # per residue row
        "outer_product_mean": 2 * B * R * cfg.c_hidden_opm**2 * e,  # per residue i
        # a slice, its product, normed product; gate, output and their product
        "triangle_multiplication": B * R * (3 * cfg.c_hidden_mul + 3 * cfg.c_z) * e,
    }


def chunk_size_for_budget(
    cfg: EvoformerConfig,
    budget_bytes: int,
    *,
    batch: int,
    num_seq: int,
    num_res: int,
    elem_bytes: int = 4,
) -> int | None:
    """The largest chunk size whose chunked temporaries fit ``budget_bytes``; None when the
    unchunked block's already do. ``ConfigError`` when not even one row fits (the message names
    the smallest budget that would)."""
    per_row = max(
        chunk_bytes_per_row(
            cfg, batch=batch, num_seq=num_seq, num_res=num_res, elem_bytes=elem_bytes
        ).values()
    )
    if budget_bytes < per_row:
        raise ConfigError(
            f"a chunk budget of {budget_bytes} bytes cannot hold one row of the chunked "
            f"Evoformer temporaries ({per_row} bytes for S={num_seq}, R={num_res}); "
            f"give at least {per_row} bytes"
        )
    size = budget_bytes // per_row
    return None if size >= max(num_seq, num_res) else int(size)
