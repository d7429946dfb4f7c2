"""How many collectives a layout runs: each costs a fixed latency beside its bytes.

[Note: collective latency] A collective costs its bytes over the link plus a fixed time to start
and synchronise (on gloo over loopback, about a millisecond of CPU per call; several when ranks
share cores), which dominates the small messages of small models and of the grid modes, whose
SUMMA runs ``q`` broadcasts per operand. The counts follow the runtime's layers, forward and
backward, as colossal-parallel's byte formulas do: Megatron 1D, per block, two all-reduces each
way (with its sequence parallelism two all-gathers and two reduce-scatters each way); a 2D/2.5D
Linear ``2q`` broadcasts forward and ``4q`` backward plus its bias's, 3D three each way, a grid
LayerNorm four each way; ring attention ``sp - 1`` block exchanges forward and ``2 sp - 1``
backward, Ulysses four all-to-alls each way; a 1F1B stage one send/receive per micro-batch each
way; Gemini two gathers and a reduction per chunk, ZeRO a reduce-scatter and an all-gather, DDP
one all-reduce per step (one bucket at these sizes). A collective over ``g`` ranks takes ``g - 1``
steps of a ring (a send/receive pair one), each costing ``Hardware.collective_latency``, which
``colossal plan --calibrate`` measures: a one-element all-reduce over the world, divided by its
ranks but one (4 gloo ranks on 2 loaded cores: about 2 ms per step).
"""

from __future__ import annotations

from ._layout import Layout
from ._shape import ModelShape

__all__ = ["collective_calls"]


def _grid_block_calls(lay: Layout) -> int:
    """Collectives of one block's four Linears and two LayerNorms on a grid, forward + backward."""
    q = lay.grid_q
    if lay.tp_mode == "3d":
        linear = 3 + 3 + 2  # all-gathers and reduce-scatter each way, the bias's
    else:
        linear = 2 * q + 4 * q + 2 + (1 if lay.tp_mode == "2.5d" else 0)
    norm = 4 + 4 + (1 if lay.tp_mode != "2d" else 0)
    return 4 * linear + 2 * norm


def collective_calls(
    shape: ModelShape, lay: Layout, num_chunks: int = 0
) -> tuple[int, int, int, int]:
    """Collectives one rank of ``lay`` runs (see [Note: collective latency]): tensor-, context-
    and pipeline-parallel ones per micro-batch, and data-parallel ones per step;
    ``num_chunks``: Gemini's parameter chunks."""
    layers = -(-shape.layers // lay.pp)
    tp = sp = 0
    if lay.tp > 1:
        per = 8 if lay.tp_mode == "1d-sp" else 4 if lay.tp_mode == "1d" else _grid_block_calls(lay)
        tp = layers * per
    if lay.sp > 1:
        sp = layers * ((3 * lay.sp - 2) if lay.sp_kind == "ring" else 8)
    pp = 2 if lay.pp > 1 else 0
    dp = 0
    if lay.dp > 1:
        dp = 3 * num_chunks if lay.method.startswith("gemini") else 1 if lay.method == "ddp" else 2
    return tp, sp, pp, dp
