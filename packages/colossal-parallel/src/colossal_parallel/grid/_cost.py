"""Closed-form counted bytes per device of each multi-dimensional layer, forward and backward.

These are the formulas of ``docs/parallel/2d.md``, ``2p5d.md`` and ``3d.md`` under the byte
convention of ``docs/parallel/mesh.md`` ([Note: counted bytes]): the bytes of the full logical
tensor of each collective, per device. ``tokens`` is the number of rows of the whole (unsplit)
activation, ``batch * seq``. A collective over an axis of size 1 is not run, hence not counted.
All figures assume every input requires a gradient (as when the layer is inside a model).
"""

from __future__ import annotations

from dataclasses import dataclass

from colossal_contracts import ConfigError

__all__ = [
    "CommCost",
    "cross_entropy_comm_bytes",
    "embedding_comm_bytes",
    "layernorm_comm_bytes",
    "linear_comm_bytes",
    "vocab_embedding_comm_bytes",
]


@dataclass(frozen=True)
class CommCost:
    """Counted bytes per device of one layer.

    Attributes:
        forward: bytes of the forward pass.
        backward: bytes of the backward pass.
    """

    forward: int
    backward: int

    @property
    def total(self) -> int:
        """Bytes of forward and backward together."""
        return self.forward + self.backward


@dataclass(frozen=True)
class _Grid:
    q: int  # size of each grid axis
    row_chunks: int  # chunks the batch is cut into (q, d*q, q*q)
    replicas: int  # size of the outer row axes that replicate vector parameters (1, d, q)


def _grid(mode: str, q: int, depth: int) -> _Grid:
    if q < 1 or depth < 1:
        raise ConfigError(f"q and depth must be positive, got q={q}, depth={depth}")
    if mode == "2d" and depth == 1:
        return _Grid(q, q, 1)
    if mode == "2.5d":
        return _Grid(q, depth * q, depth)
    if mode == "3d" and depth == 1:
        return _Grid(q, q * q, q)
    raise ConfigError(f"mode must be '2d', '2.5d' (with depth) or '3d', got {mode!r} depth={depth}")


def _on(size: int, n: float) -> float:
    """``n`` when the axis has more than one rank (collectives on one rank are not counted)."""
    return n if size > 1 else 0


def linear_comm_bytes(
    mode: str,
    q: int,
    *,
    depth: int = 1,
    tokens: int,
    in_features: int,
    out_features: int,
    bias: bool = True,
    dtype_bytes: int = 4,
) -> CommCost:
    """Counted bytes of ``Linear{2D,2p5D,3D}`` forward and backward on one device."""
    g = _grid(mode, q, depth)
    m, k, n = tokens, in_features, out_features
    rows = m / g.row_chunks  # local rows of the input block
    if mode == "3d":  # all-gather X, all-gather W, reduce-scatter Y; mirrored in backward
        fwd = _on(q, rows * k + k * n / q**2 + rows * n)
        bwd = _on(q, rows * n + rows * k + k * n / q**2)
    else:  # SUMMA: q broadcasts of X and W blocks; q broadcasts + q reduces per gradient
        fwd = _on(q, rows * k + k * n / q)
        bwd = _on(q, 2 * rows * k + 2 * k * n / q) + _on(g.replicas, k * n / q**2)
    if bias:
        fwd += _on(q, n / q)
        bwd += _on(q, n / q) + _on(g.replicas, n / q**2)
    return CommCost(round(fwd * dtype_bytes), round(bwd * dtype_bytes))


def layernorm_comm_bytes(
    mode: str, q: int, *, depth: int = 1, tokens: int, hidden: int, dtype_bytes: int = 4
) -> CommCost:
    """Counted bytes of ``LayerNorm{2D,2p5D,3D}``: two statistics all-reduces per pass, plus the
    affine weight and bias gathered forward and reduce-scattered (and replica-reduced) backward."""
    g = _grid(mode, q, depth)
    rows = tokens / g.row_chunks
    fwd = _on(q, 2 * rows) + _on(q, 2 * hidden / q)
    bwd = _on(q, 2 * rows) + _on(q, 2 * hidden / q) + _on(g.replicas, 2 * hidden / q**2)
    return CommCost(round(fwd * dtype_bytes), round(bwd * dtype_bytes))


def embedding_comm_bytes(
    mode: str, q: int, *, depth: int = 1, num_embeddings: int, dim: int, dtype_bytes: int = 4
) -> CommCost:
    """Counted bytes of ``Embedding{2D,2p5D,3D}``: its columns are a vector parameter."""
    g = _grid(mode, q, depth)
    block = num_embeddings * dim / q  # the (V, dim/q) block a rank looks up in
    fwd = _on(q, block)
    bwd = _on(q, block) + _on(g.replicas, block / q)
    return CommCost(round(fwd * dtype_bytes), round(bwd * dtype_bytes))


def vocab_embedding_comm_bytes(
    mode: str,
    q: int,
    *,
    depth: int = 1,
    tokens: int,
    num_embeddings: int,
    dim: int,
    dtype_bytes: int = 4,
    id_bytes: int = 8,
) -> CommCost:
    """Counted bytes of ``VocabParallelEmbedding{2D,2p5D,3D}``: ids all-gathered and partial
    embeddings reduce-scattered along the vocabulary axis; gradient all-gathered back."""
    g = _grid(mode, q, depth)
    local_tokens = tokens / g.row_chunks
    fwd = _on(q, q * local_tokens * id_bytes) + _on(q, local_tokens * dim * dtype_bytes)
    bwd = _on(q, local_tokens * dim * dtype_bytes)
    bwd += _on(g.replicas, num_embeddings * dim / q**2 * dtype_bytes)
    return CommCost(round(fwd), round(bwd))


def cross_entropy_comm_bytes(
    mode: str, q: int, *, depth: int = 1, tokens: int, dtype_bytes: int = 4
) -> CommCost:
    """Counted bytes of ``cross_entropy_{2d,2p5d,3d}``: max, sum of exponentials and target logit
    all-reduced per local token along the vocabulary axis, then one scalar per row axis. The
    backward pass is local."""
    g = _grid(mode, q, depth)
    local_tokens = tokens / g.row_chunks
    scalars = (
        _on(q, 1) + (_on(depth, 1) if mode == "2.5d" else 0) + (_on(q, 1) if mode == "3d" else 0)
    )
    fwd = _on(q, 3 * local_tokens) + scalars
    return CommCost(round(fwd * dtype_bytes), 0)
