"""Bytes per device of a layout at its peak: parameters, gradients, optimizer states,
activations, buffers, and what it puts on the host and on disk.

[Note: memory model] Model states follow ZeRO's bytes per parameter
(``colossal_zero.model_state_bytes_per_param``, mixed precision: 2 + 2 + 12; in fp32 the
parameters and gradients take 4 bytes and Adam's two states 8, the parameters being the masters)
on the parameters of the busiest pipeline stage (``L/pp`` blocks plus the embeddings), split by
``tp`` except, in the 1D modes, the parameters it replicates (positions, LayerNorms, row-parallel
biases). Gemini counts whole chunks as its runtime lays them out ([Note: gemini chunks] in
``_gemini``: padding, fp32's gradient twins, the chunks gathered at once, a spare payload on the
host); its tiers move the optimizer states (``gemini-host``), all model states
(``gemini-host-all``) or the parameters to the host and the optimizer states to disk beyond
what the host budget holds (``gemini-disk``), the device then holding the chunks in flight
(gathered buffers and parameter shards) and the host the disk tier's read-ahead window
([Note: gemini tiers] in ``_gemini_tiers``).

Activations are the runtime's (``_activation``, fused attention): per layer, times the layers of a
stage, times the micro-batches a 1F1B first stage holds (``min(pp, m)``), plus one layer's full
activations while a fully recomputed layer runs, plus the larger of the output layer and loss
(last stage) and one layer's backward working set. A 1F1B stage also holds, until the step ends,
its outputs (first stages) or input gradients (last stage) of every micro-batch, which its
asynchronous sends reference, and the received gradient of the micro-batch it runs backward.

The peak is the start of the backward pass, when every activation is held. What lives only from
the backward pass to the optimizer step (``transient``: the gradients of a runtime that frees them
in ``zero_grad``, DDP's and ZeRO-2's reduce buckets) grows as activations are freed, so the peak
holds the larger of the activations and ``overlap + transient``, where ``overlap`` is what is still
held once the transients are: nothing without pipelining (the backward pass ends with no
activations), and on a 1F1B stage that keeps running forwards after its first backward, the
micro-batches then in flight. ZeRO-2 over more than one rank is the exception: its reduce bucket
is allocated at the first gradient of the backward pass, while every activation is held
(measured: plan_vs_measured's ZeRO-2 row was 18% low without it). Plain data parallelism at ``tp = pp = sp = 1`` is torch DDP, whose
gradient buckets (``buffers``) hold a second copy of every gradient.

[Note: frozen parameters] Parameters with ``requires_grad=False`` (a LoRA run's base,
``ModelShape.frozen``) take their compute-precision bytes (2 in bf16, 4 in fp32) and nothing
else: no gradient, no fp32 master, no Adam state. Gemini shards them over dp like every
parameter (its frozen chunks, kept where the tiers put the 16-bit parameters); ZeRO-1/2 and
DDP replicate them. The trainable rest follows ZeRO's formula as above.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from colossal_contracts import ConfigError
from colossal_zero import model_state_bytes_per_param

from ._activation import head_activation_bytes, layer_activation_bytes, layer_backward_bytes
from ._gemini import gemini_bytes
from ._gemini_tiers import disk_host_budget, gemini_tiers
from ._layout import ZERO_STAGE, Layout
from ._shape import ModelShape

__all__ = ["PRECISIONS", "MemoryBreakdown", "device_memory"]

PRECISIONS = ("bf16", "fp32")
ZERO_BUCKET_NUMEL = 1 << 22  # colossal_zero.ZeroConfig's default bucket


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes per device by kind at the step's peak, and per device on the host and on disk.

    ``transient`` and ``overlap``: see [Note: memory model]; ``device_total`` is the peak.
    ``frozen``: the part of ``params`` (or of ``host``, where the tiers put the 16-bit
    parameters) that frozen parameters take ([Note: frozen parameters]). ``read_ahead``: the
    part of ``host`` that is disk pages read ahead; ``host_budget``: ``gemini-disk``'s host
    tier budget, 0 otherwise ([Note: gemini tiers]).
    """

    params: float
    grads: float
    optimizer: float
    activations: float
    buffers: float
    host: float = 0.0
    disk: float = 0.0
    transient: float = 0.0
    overlap: float = 0.0
    frozen: float = 0.0
    read_ahead: float = 0.0
    host_budget: float = 0.0

    @property
    def device_total(self) -> float:
        held = max(self.activations, self.overlap + self.transient)
        return self.params + self.grads + self.optimizer + self.buffers + held

    def at_peak(self) -> dict[str, float]:
        """Bytes by kind at the peak moment (they sum to ``device_total``): the step's transients
        count as gradients and buffers when they, not the activations, set the peak."""
        out = {k: getattr(self, k) for k in ("params", "grads", "optimizer", "activations")}
        out["buffers"] = self.buffers
        if self.overlap + self.transient > self.activations:
            out["grads"] += self.transient
            out["activations"] = self.overlap
        return out

    def as_dict(self) -> dict[str, float]:
        return {**asdict(self), "device_total": self.device_total}


def stage_params(shape: ModelShape, pp: int) -> float:
    """Parameters of the busiest stage: ``ceil(L/pp)`` blocks plus the embeddings (the first
    stage holds them, the last its tied copy)."""
    if pp == 1:
        return float(shape.params)
    return math.ceil(shape.layers / pp) * shape.layer_params + shape.embed_params


def device_params(shape: ModelShape, lay: Layout) -> float:
    """Parameters one device of the busiest stage holds before any ZeRO sharding."""
    n = stage_params(shape, lay.pp)
    if lay.tp == 1:
        return n
    if lay.tp_mode not in ("1d", "1d-sp"):
        return n / lay.tp
    share = n / shape.params
    rep = shape.replicated_params * share
    return (n - rep) / lay.tp + rep


def activation_bytes(
    shape: ModelShape, lay: Layout, seq_len: int, act_bytes: int = 2
) -> tuple[float, float]:
    """Activation bytes of the busiest stage at the peak, and those still held once the step's
    transients are (see [Note: memory model])."""
    mode = "1d" if lay.tp_mode == "1d-sp" else lay.tp_mode
    sp_on = lay.tp_mode == "1d-sp"
    kw = dict(seq=seq_len, batch=lay.micro_batch, hidden=shape.hidden, tp=lay.tp, sp=lay.sp)
    layer = dict(kw, heads=shape.heads, tp_mode=mode, megatron_sp=sp_on, attention="fused")
    layer.update(act_bytes=act_bytes, dropout=shape.dropout > 0, ffn=shape.ffn)
    norms = 2 if (mode != "1d" or shape.rmsnorm) else 1
    layer.update(kv_heads=shape.kv_heads, gated=shape.gated, norm_tensors=norms)
    per = math.ceil(shape.layers / lay.pp) * layer_activation_bytes(
        **layer, recompute=lay.recompute
    )
    running = layer_activation_bytes(**layer) if lay.recompute == "full" else 0.0
    split_all = sp_on or mode != "1d"
    working = layer_backward_bytes(**kw, split_all=split_all, act_bytes=act_bytes, ffn=shape.ffn)
    head = head_activation_bytes(
        **kw,
        vocab=shape.vocab,
        tp_mode=mode,
        megatron_sp=sp_on,
        grid_q=lay.grid_q,
        act_bytes=act_bytes,
        norm_tensors=norms,
    )
    if lay.pp == 1:
        return per + running + max(head, working), 0.0
    # 1F1B: a stage's output (first) or input gradient (last) stays referenced by its pending
    # asynchronous send until the step's end, one per micro-batch.
    out = act_bytes * seq_len * lay.micro_batch * shape.hidden / lay.sp
    out /= lay.tp if split_all else 1
    m, inflight = lay.num_micro, min(lay.pp, lay.num_micro)
    first = inflight * (per + out) + (m - inflight) * out + out + working + running
    after = first if m > inflight else first - per - out
    last = per + running + max(head, working) + (m - 1) * out
    return (first, after) if first >= last else (last, last)


def device_memory(
    shape: ModelShape,
    lay: Layout,
    seq_len: int,
    *,
    precision: str = "bf16",
    host_memory: float | None = None,
) -> MemoryBreakdown:
    """The peak memory of one device of the busiest stage under ``lay`` (see [Note: memory
    model]); ``precision`` ``bf16`` is mixed precision (16-bit activations), ``fp32`` all fp32.
    ``host_memory``: the host bytes one device's job may use, which bounds what ``gemini-disk``
    keeps on the host before it spills to disk (None: no bound)."""
    if precision not in PRECISIONS:
        raise ConfigError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    n = device_params(shape, lay)
    stage = ZERO_STAGE.get(lay.method, 3)
    w = 2 if precision == "bf16" else 4  # parameter, gradient and activation element bytes
    opt = 1.0 if precision == "bf16" else 8 / 12
    pb, gb, ob = model_state_bytes_per_param(stage, lay.dp, grads_in_param_slots=True)
    frozen = n * shape.frozen / shape.params  # [Note: frozen parameters]
    t = n - frozen
    fz = frozen * w / (lay.dp if stage == 3 else 1)
    p, g, o = pb * t * w / 2 + fz, gb * t * w / 2, ob * t * opt
    act, overlap = activation_bytes(shape, lay, seq_len, w)
    if stage == 0:  # gradients freed by zero_grad; torch DDP's buckets copy them
        ddp = lay.dp > 1 and lay.tp == lay.pp == lay.sp == 1
        buckets = g if ddp else 0.0
        return MemoryBreakdown(p, 0.0, o, act, buckets, transient=g, overlap=overlap, frozen=fz)
    if stage < 3:
        bucket = min(ZERO_BUCKET_NUMEL, t) * w if stage == 2 else 0.0
        if stage == 2 and lay.dp > 1:  # its first bucket opens at the first gradient: all
            overlap = act  # activations are still held (see [Note: memory model])
        return MemoryBreakdown(p, g, o, act, 0.0, transient=bucket, overlap=overlap, frozen=fz)
    gem = gemini_bytes(shape, lay, precision, max(act, overlap))  # [Note: gemini chunks]
    p, g, o, working, spare = gem.params, gem.grads, gem.optimizer, gem.gathered, gem.spare
    kw = dict(transient=0.0, overlap=overlap, frozen=gem.frozen)
    if lay.method == "gemini":
        return MemoryBreakdown(p, g, o, act, working, host=spare, **kw)
    if lay.method == "gemini-host":
        return MemoryBreakdown(p, g, 0.0, act, working, host=o + spare, **kw)
    if lay.method == "gemini-host-all":  # [Note: gemini tiers]: no host budget, no disk
        t = gemini_tiers(gem, lay.dp, precision, host_budget=None)
        return MemoryBreakdown(0.0, 0.0, 0.0, act, t.device, host=t.host, **kw)
    budget = disk_host_budget(gem, lay.dp, host_memory=host_memory)  # gemini-disk
    t = gemini_tiers(gem, lay.dp, precision, host_budget=budget)
    kw.update(read_ahead=t.read_ahead, host_budget=t.host_budget)
    return MemoryBreakdown(0.0, 0.0, 0.0, act, t.device, host=t.host, disk=t.disk, **kw)
