"""Counted bytes per device of one Megatron 1D transformer block (see [Note: counted bytes] in
``docs/parallel/mesh.md``: each collective counts its full logical tensor)."""

from __future__ import annotations

__all__ = ["block_comm_bytes_1d"]


def block_comm_bytes_1d(
    tokens: int,
    hidden: int,
    tp: int,
    *,
    sequence_parallel: bool = False,
    bias: bool = True,
    dtype_bytes: int = 2,
) -> tuple[int, int]:
    """``(forward, backward)`` bytes of one attention + MLP block under 1D tensor parallelism.

    Without sequence parallelism each pass all-reduces a ``tokens x hidden`` tensor twice (after
    the row-parallel Linears forward, before the column-parallel ones backward); with it each
    all-reduce becomes an all-gather plus a reduce-scatter of the same full tensor. No
    collective runs when ``tp == 1``. Under sequence parallelism the gradients of the parameters
    applied to sequence-split activations (the two LayerNorms' weights and biases, the two
    row-parallel biases) are partial sums, all-reduced in backward: ``2 (1 + bias) + 2 bias``
    vectors of ``hidden``.
    """
    if tp == 1:
        return 0, 0
    if not sequence_parallel:
        n = 2 * tokens * hidden * dtype_bytes
        return n, n
    n = 4 * tokens * hidden * dtype_bytes
    vectors = 2 * (1 + bias) + 2 * bias
    return n, n + vectors * hidden * dtype_bytes
