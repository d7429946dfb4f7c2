"""Bytes per device of a layout: parameters, gradients, optimizer states, activations, buffers,
and what it puts on the host and on disk.

[Note: memory model] Model states follow ZeRO's bytes per parameter
(``colossal_zero.model_state_bytes_per_param``; Gemini's gradients reuse the 16-bit parameters'
chunk slots, so it holds 14/dp) on the parameters of the busiest pipeline stage
(``L/pp`` blocks plus the embeddings), split by ``tp`` in every mode (the replicated vectors of
the grid modes are ignored: they are < 0.1% of a block). Gemini's tiers move the 12 optimizer
bytes (``gemini-host``), all 16 (``gemini-host-all``) or the 12 to disk and the 4 to the host
(``gemini-disk``); the device then holds the working set of one block's gathered 16-bit parameters
and gradients (``colossal_zero.zero3_device_bytes``: 4 bytes per parameter of the largest layer). Activations are Korthikanti et al.'s per layer (``_activation``), times the
layers of a stage, times the micro-batches a 1F1B first stage holds (``min(pp, m)``), plus one
layer's full activations while a fully recomputed layer runs, plus the logits on the last stage.
Buffers are the gradient buckets of DDP and ZeRO (2 x 25 MiB) or Gemini's working set.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from colossal_zero import model_state_bytes_per_param, zero3_device_bytes

from ._activation import layer_activation_bytes, logits_bytes
from ._layout import ZERO_STAGE, Layout
from ._shape import ModelShape

__all__ = ["MemoryBreakdown", "device_memory"]

BUCKET_BYTES = 2 * 25 * 2**20


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes per device by kind, and per device on the host and on disk."""

    params: float
    grads: float
    optimizer: float
    activations: float
    buffers: float
    host: float = 0.0
    disk: float = 0.0

    @property
    def device_total(self) -> float:
        return self.params + self.grads + self.optimizer + self.activations + self.buffers

    def as_dict(self) -> dict[str, float]:
        return {**asdict(self), "device_total": self.device_total}


def stage_params(shape: ModelShape, pp: int) -> float:
    """Parameters of the busiest stage: ``ceil(L/pp)`` blocks plus the embeddings (the first
    stage holds them, the last its tied copy)."""
    if pp == 1:
        return float(shape.params)
    return math.ceil(shape.layers / pp) * shape.layer_params + shape.embed_params


def activation_bytes(shape: ModelShape, lay: Layout, seq_len: int) -> float:
    """Activation bytes of the busiest stage (see [Note: memory model])."""
    kw = dict(
        seq=seq_len,
        batch=lay.micro_batch,
        hidden=shape.hidden,
        heads=shape.heads,
        tp=lay.tp,
        tp_mode="1d" if lay.tp_mode == "1d-sp" else lay.tp_mode,
        megatron_sp=lay.tp_mode == "1d-sp",
        sp=lay.sp,
    )
    per = layer_activation_bytes(**kw, recompute=lay.recompute)
    layers = math.ceil(shape.layers / lay.pp)
    inflight = min(lay.pp, lay.num_micro)
    first = layers * inflight * per
    if lay.recompute == "full":
        first += layer_activation_bytes(**kw, recompute="none")
    logits = logits_bytes(
        seq=seq_len, batch=lay.micro_batch, vocab=shape.vocab, tp=lay.tp, sp=lay.sp
    )
    if lay.pp == 1:
        return first + logits
    last = layers * per + logits + (first - layers * inflight * per)
    return max(first, last)


def device_memory(shape: ModelShape, lay: Layout, seq_len: int) -> MemoryBreakdown:
    """The memory of one device of the busiest stage under ``lay`` (see [Note: memory model])."""
    n = stage_params(shape, lay.pp) / lay.tp
    stage = ZERO_STAGE.get(lay.method, 3)
    per = model_state_bytes_per_param(stage, lay.dp, grads_in_param_slots=True)
    p, g, o = (b * n for b in per)
    act = activation_bytes(shape, lay, seq_len)
    if stage < 3:
        return MemoryBreakdown(p, g, o, act, BUCKET_BYTES)
    working = zero3_device_bytes(0, shape.layer_params / lay.tp, 1, offload="all")
    if lay.method == "gemini":
        return MemoryBreakdown(p, g, o, act, working)
    if lay.method == "gemini-host":
        return MemoryBreakdown(p, g, 0.0, act, working, host=o)
    if lay.method == "gemini-host-all":
        return MemoryBreakdown(0.0, 0.0, 0.0, act, working, host=p + g + o)
    return MemoryBreakdown(0.0, 0.0, 0.0, act, working, host=p + g, disk=o)  # gemini-disk
