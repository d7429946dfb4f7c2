"""Estimated step time and MFU of a layout.

[Note: cost model] One micro-batch on one device takes its FLOPs (``flops_per_token`` x tokens /
(pp tp sp), plus one more forward under full recomputation: x 4/3 when every weight trains; a
frozen weight's backward skips its weight-gradient GEMM) at ``efficiency`` x peak, plus its tensor-parallel,
context-parallel and pipeline messages, which are not overlapped; a step is
``(m + pp - 1)`` such micro-batch slots (1F1B: the bubble ``(pp-1)/(m+pp-1)``; ``m`` on CPU
ranks that outnumber the cores, ``Hardware.oversubscribed``, where an idle rank's core runs the
others). The data-parallel
gradient traffic overlaps the backward pass (ZeRO-3/Gemini's gathers the whole step), so only
what exceeds it shows. Offload traffic (PCIe, disk) and the host Adam step are not overlapped.
Memory-bound work (``memory_bound``) is modelled at the device's ``mem_bw``: each activation the
step saves written in forward, read and its gradient written in backward (three passes over
the activations of one micro-batch), and a device AdamW step reading and writing 28 bytes per
parameter it updates.
Each collective also costs the hardware's ``collective_latency`` ([Note: collective latency]).
Bytes are colossal-parallel's counted bytes (``block_comm_bytes_1d``, ``linear_comm_bytes``,
``ulysses_comm_bytes``, ``ring_attention_comm_bytes``, ``pipeline_p2p_bytes``) turned into wire bytes by the ring factor
``(g-1)/g`` per gathered or scattered tensor, and into seconds by the link they cross.
"""

from __future__ import annotations

from dataclasses import dataclass

from colossal_parallel.grid import layernorm_comm_bytes, linear_comm_bytes
from colossal_parallel.pipeline import ideal_idle_fraction, pipeline_p2p_bytes
from colossal_parallel.sequence import ring_attention_comm_bytes, ulysses_comm_bytes
from colossal_parallel.tp1d import block_comm_bytes_1d

from ._calls import collective_calls
from ._hardware import Hardware
from ._layout import Layout
from ._memory import MemoryBreakdown, stage_params
from ._shape import ModelShape

__all__ = ["StepCost", "dp_comm_bytes", "step_cost", "tp_block_bytes"]

HOST_ADAM_PARAMS_PER_S = 1e9  # fp32 Adam on host cores, parameters per second per device


@dataclass(frozen=True)
class StepCost:
    """Seconds of one step by part, and the model FLOPs utilisation."""

    compute: float
    tp_comm: float
    sp_comm: float
    pp_comm: float
    dp_comm: float
    offload: float
    bubble: float
    step: float
    mfu: float
    memory_bound: float = 0.0


def _link(hw: Hardware, inner: int) -> float:
    """Bandwidth of an axis whose groups span ``inner`` consecutive devices."""
    return hw.intra_bw if inner <= hw.devices_per_node else hw.inter_bw


def tp_block_bytes(shape: ModelShape, lay: Layout, tokens: int, dtype_bytes: int = 2) -> float:
    """Counted bytes of one block's forward + backward on one device under ``lay``'s tensor
    parallelism (``tokens`` rows of the whole activation): Megatron's ``block_comm_bytes_1d``, or
    the grid modes' four Linears (qkv, proj, fc, fc2) and two LayerNorms."""
    if lay.tp == 1:
        return 0.0
    if lay.tp_mode in ("1d", "1d-sp"):
        f, b = block_comm_bytes_1d(
            tokens,
            shape.hidden,
            lay.tp,
            sequence_parallel=lay.tp_mode == "1d-sp",
            dtype_bytes=dtype_bytes,
        )
        return f + b
    h, q, d = shape.hidden, lay.grid_q, lay.depth
    total = 0
    for k, n in ((h, 3 * h), (h, h), (h, 4 * h), (4 * h, h)):
        c = linear_comm_bytes(
            lay.tp_mode,
            q,
            depth=d,
            tokens=tokens,
            in_features=k,
            out_features=n,
            dtype_bytes=dtype_bytes,
        )
        total += c.total
    ln = layernorm_comm_bytes(lay.tp_mode, q, depth=d, tokens=tokens, hidden=h, dtype_bytes=4)
    return total + 2 * ln.total


def _tp_bytes(shape: ModelShape, lay: Layout, tokens: int) -> float:
    """Wire bytes of one block's forward + backward on one device: counted bytes x the ring
    factor (``(g-1)/g`` per gathered or scattered tensor, twice that per all-reduce)."""
    if lay.tp == 1:
        return 0.0
    counted = tp_block_bytes(shape, lay, tokens)
    if lay.tp_mode in ("1d", "1d-sp"):
        return counted * (lay.tp - 1) / lay.tp * (1 if lay.tp_mode == "1d-sp" else 2)
    return counted * (lay.grid_q - 1) / lay.grid_q


def dp_comm_bytes(shape: ModelShape, lay: Layout) -> float:
    """Counted data-parallel bytes of one step on one device: 16-bit gradients reduce-scattered
    and parameters all-gathered (DDP's all-reduce counts the same), 2 bytes per parameter each;
    Gemini gathers parameters twice (forward and backward). Frozen parameters have no
    gradient: Gemini gathers them twice, ZeRO-1/2 and DDP replicate them (no traffic). 0 without
    data parallelism."""
    if lay.dp == 1:
        return 0.0
    n = stage_params(shape, lay.pp) / lay.tp
    trainable = n * shape.trainable / shape.params
    if lay.method.startswith("gemini"):
        return 2 * (3 * trainable + 2 * (n - trainable))
    return 2 * 2 * trainable


def step_cost(
    shape: ModelShape,
    lay: Layout,
    mem: MemoryBreakdown,
    hw: Hardware,
    seq_len: int,
    *,
    efficiency: float = 0.6,
    num_chunks: int = 0,
) -> StepCost:
    """The step time of ``lay`` (see [Note: cost model]); ``num_chunks``: Gemini's parameter
    chunks, whose collectives cost ``hw.collective_latency`` each."""
    tokens_mb = lay.micro_batch * seq_len
    layers = -(-shape.layers // lay.pp)
    # the forward's share of a step's FLOPs: 1/3 when every weight trains, about 1/2 when
    # most are frozen (their backward skips the weight-gradient GEMM; ``flops_per_token``)
    fwd_share = shape.forward_flops_per_token(seq_len) / shape.flops_per_token(seq_len)
    recompute = 1 + fwd_share if lay.recompute == "full" else 1.0
    flops_mb = shape.flops_per_token(seq_len) * tokens_mb / (lay.pp * lay.tp * lay.sp)
    compute_mb = flops_mb * recompute / (hw.peak_flops * efficiency)
    tp_mb = layers * _tp_bytes(shape, lay, tokens_mb // lay.sp) / _link(hw, lay.tp)
    sp_mb = 0.0
    if lay.sp > 1:
        heads = max(1, shape.heads // lay.tp)
        count = ring_attention_comm_bytes if lay.sp_kind == "ring" else ulysses_comm_bytes
        f, b = count(
            lay.micro_batch, heads, seq_len, shape.hidden // shape.heads, lay.sp, elem_bytes=2
        )
        # the ring's count is what a rank sends; an all-to-all counts its input, of which
        # (sp-1)/sp leaves the rank
        wire = 1.0 if lay.sp_kind == "ring" else (lay.sp - 1) / lay.sp
        sp_mb = layers * (f + b) * wire / _link(hw, lay.tp * lay.sp)
    pp_mb = 0.0
    if lay.pp > 1:
        numel = tokens_mb * shape.hidden // (lay.tp * lay.sp)
        sent = pipeline_p2p_bytes(1, max(lay.pp, 3), 1, numel, elem_bytes=2)
        pp_mb = sent / _link(hw, lay.devices)
    # elementwise work: each saved activation written in forward, read and its gradient
    # written in backward, at the device's memory bandwidth
    held = max(1, min(lay.pp, lay.num_micro)) if lay.pp > 1 else 1
    mem_mb = 3 * mem.activations / held / hw.mem_bw if hw.mem_bw else 0.0
    tp_calls, sp_calls, pp_calls, dp_calls = collective_calls(shape, lay, num_chunks)
    lat = hw.collective_latency  # [Note: collective latency]: by kind, beside the bytes
    tp_group = lay.tp if lay.tp_mode in ("1d", "1d-sp") else lay.grid_q
    tp_mb += lat * tp_calls * (tp_group - 1)
    sp_mb += lat * sp_calls * (lay.sp - 1)
    pp_mb += lat * pp_calls
    # CPU ranks sharing cores: a rank idle in the bubble hands its core to the others
    slots = lay.num_micro + (0 if hw.oversubscribed else lay.pp - 1)
    busy = slots * (compute_mb + tp_mb + sp_mb + pp_mb + mem_mb)
    backward = lay.num_micro * compute_mb * (1 - fwd_share)
    n_dev = stage_params(shape, lay.pp) / lay.tp
    dp_bytes = dp_comm_bytes(shape, lay) * (lay.dp - 1) / lay.dp
    dp_time = dp_bytes / _link(hw, lay.tp * lay.sp * lay.dp)
    hidden_by = lay.num_micro * compute_mb if lay.method.startswith("gemini") else backward
    dp_exposed = max(0.0, dp_time - hidden_by) + lat * dp_calls * (lay.dp - 1)
    offload = 0.0
    shard = n_dev / lay.dp * shape.trainable / shape.params  # Adam updates trainable ones only
    if lay.method in ("gemini-host", "gemini-disk", "gemini-host-all"):
        offload += shard / HOST_ADAM_PARAMS_PER_S
    if lay.method in ("gemini-host", "gemini-disk"):
        offload += 4 * shard / hw.pcie_bw  # fp16 gradients down, parameters up
    if lay.method == "gemini-host-all":  # params up fwd+bwd, grads down, per micro-batch
        offload += lay.num_micro * (4 * n_dev / lay.dp + 2 * shard) / hw.pcie_bw
    if lay.method == "gemini-disk":
        offload += 2 * mem.disk / hw.disk_bw  # the states on disk read and written
    adam = 0.0
    if hw.mem_bw and lay.method in ("ddp", "zero1", "zero2", "gemini"):
        # AdamW on the device: read parameter, gradient and both moments, write three back
        adam = 7 * 4 * (shard if lay.method != "ddp" else shard * lay.dp) / hw.mem_bw
    step = busy + dp_exposed + offload + adam
    model_flops = shape.flops_per_token(seq_len) * seq_len * lay.micro_batch * lay.num_micro
    mfu = model_flops * lay.dp / (step * lay.devices * hw.peak_flops)
    bubble = ideal_idle_fraction("1f1b", lay.pp, lay.num_micro)  # == (pp-1) / slots
    return StepCost(
        slots * compute_mb,
        slots * tp_mb,
        slots * sp_mb,
        slots * pp_mb,
        dp_exposed,
        offload,
        bubble,
        step,
        mfu,
        slots * mem_mb + adam,
    )
