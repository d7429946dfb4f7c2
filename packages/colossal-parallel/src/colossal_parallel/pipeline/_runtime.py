"""``run_pipeline``: execute one rank's schedule over its stage chunks, exchanging activations and
gradients with the neighbouring ``pp`` ranks.

[Note: pipeline messages] Before an action, its input is received (the previous virtual stage's
activation for a forward, the next one's gradient for a backward); after it, its output is sent
(``batch_isend_irecv``, not waited for until the step ends). Receives block, sends do not, so a
schedule runs exactly as ``simulate`` replays it and cannot deadlock when ``simulate`` does not.
Each message has its own tag: ``2 * (microbatch * S + stage)`` for the activation entering virtual
stage ``stage`` of ``S``, plus one for the gradient leaving it backwards.

[Note: pipeline loss] The last virtual stage returns each micro-batch's mean loss; backward runs on
``loss / m``, so accumulated gradients are those of the mean loss over the whole batch (equal-size
micro-batches). The reported loss is that mean, broadcast from the last rank to every ``pp`` rank.

[Note: tied parameters] Parameters used on both the first and the last virtual stage (a tied
input embedding and output head) exist once on each of the two ranks. After the backward passes
the two ranks swap gradients and both keep ``g_first + g_last`` (the same sum on both), so an
optimizer keeps the copies identical, as Megatron does.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from colossal_contracts import ConfigError

from .._mesh import ProcessMesh
from .._p2p import exchange, wait_all
from ._partition import stage_rank
from ._schedule import Action, PipelineSchedule

__all__ = ["PipelineResult", "run_pipeline"]

AXIS = "pp"
_TIED_TAG = 1 << 24  # above every activation/gradient tag of [Note: pipeline messages]


@dataclass
class PipelineResult:
    """What one pipeline step reports on a rank.

    Attributes:
        loss: the batch's mean loss (0-dim, detached), identical on every ``pp`` rank.
        timeline: this rank's actions with ``time.perf_counter`` start and end; the start is
            after its input arrived, so gaps between actions are the rank's idle time.
    """

    loss: torch.Tensor
    timeline: list[tuple[Action, float, float]] = field(default_factory=list)


class _Mailbox:
    """Messages to and from this rank's pipeline neighbours; a stage whose neighbour is on the
    same rank (pp = 1 with several chunks) hands the tensor over locally."""

    def __init__(self, mesh: ProcessMesh, device: torch.device) -> None:
        self.mesh, self.me, self.device = mesh, mesh.coord(AXIS), device
        self.sends: list = []  # works (and tensors they read) to wait for at the end
        self.local: dict[int, torch.Tensor] = {}

    def send(self, t: torch.Tensor, peer: int, tag: int) -> None:
        t = t.detach().contiguous()
        if peer == self.me:
            self.local[tag] = t
            return
        works = exchange(self.mesh.comm, AXIS, sends=[(t, peer, tag)])
        self.sends.append((works, t))

    def recv(self, shape: tuple[int, ...], dtype: torch.dtype, peer: int, tag: int):
        if peer == self.me:
            return self.local.pop(tag)
        buf = torch.empty(shape, dtype=dtype, device=self.device)
        wait_all(exchange(self.mesh.comm, AXIS, recvs=[(buf, peer, tag)]))
        return buf

    def flush(self) -> None:
        for works, _ in self.sends:
            wait_all(works)
        self.sends.clear()


def _check(chunks, mesh, schedule, inputs, targets, boundary_shape, tied) -> None:
    """Every ``ConfigError`` of a step, raised before any message is sent."""
    if not isinstance(schedule, PipelineSchedule):
        raise ConfigError(f"run_pipeline needs a PipelineSchedule, got {type(schedule).__name__}")
    if len(chunks) != schedule.num_virtual:
        raise ConfigError(
            f"this rank holds {len(chunks)} stage chunks but the schedule runs "
            f"num_virtual={schedule.num_virtual} per rank; split the model into "
            f"pp * num_virtual = {mesh.size(AXIS) * schedule.num_virtual} stages"
        )
    if inputs.dim() == 0 or targets.shape[:1] != inputs.shape[:1]:
        raise ConfigError(
            f"inputs {tuple(inputs.shape)} and targets {tuple(targets.shape)} need the same "
            "leading (batch) dimension"
        )
    schedule.validate(mesh.size(AXIS), inputs.shape[0])
    p, me = mesh.size(AXIS), mesh.coord(AXIS)
    if tied and p > 1 and me not in (0, p - 1):
        raise ConfigError(
            f"pp rank {me} passed tied parameters; only the ranks of the first and last stage "
            "hold them (pass tied=() elsewhere)"
        )
    mb = inputs.shape[0] // schedule.num_microbatches
    if not boundary_shape or boundary_shape[0] < 1 or mb % boundary_shape[0]:
        raise ConfigError(
            f"boundary_shape {tuple(boundary_shape)} must be this rank's part of one "
            f"micro-batch's activation between stages, leading with the micro-batch size {mb} "
            "(or its share of it where a tensor-parallel layout splits the batch)"
        )


def run_pipeline(
    chunks: Sequence[nn.Module],
    mesh: ProcessMesh,
    schedule: PipelineSchedule,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    *,
    boundary_shape: Sequence[int],
    boundary_dtype: torch.dtype = torch.float32,
    tied: Sequence[nn.Parameter] = (),
    device: torch.device | None = None,
    loss_scale: float = 1.0,
) -> PipelineResult:
    """Forward and backward of one batch through the pipeline; gradients accumulate in ``.grad``.

    ``chunks[c]`` is this rank's virtual stage ``c * pp + coord("pp")`` ([Note: stage order]).
    The first stage is called ``chunk(inputs_mb)``, the last ``chunk(x, targets_mb)`` and must
    return a scalar loss; the others ``chunk(x)``, where ``x`` has ``boundary_shape`` (one
    micro-batch's activation between stages, as this rank holds it: a grid tensor-parallel
    layout splits its batch and hidden dims). Every rank passes the whole batch; only the first
    and last stage read it. ``tied`` lists the parameters shared by the first and last stage
    ([Note: tied parameters]), in the same order on both ranks. Data-parallel replicas of the
    pipeline reduce their gradients afterwards, like any replica. Received activations and
    gradients are allocated on ``device`` (None: the device of the first chunk's parameters,
    else of ``inputs``); the batch is moved there. Backward runs on ``loss * loss_scale / m``
    (fp16 loss scaling, or a data-parallel reduction's factor); the reported loss is unscaled.
    """
    _check(chunks, mesh, schedule, inputs, targets, boundary_shape, tied)
    p, me, m, v = mesh.size(AXIS), mesh.coord(AXIS), schedule.num_microbatches, len(chunks)
    num_stages, shape = p * v, tuple(boundary_shape)
    last = num_stages - 1
    dev = device if device is not None else _device_of(chunks, inputs)
    xs, ts = inputs.to(dev).chunk(m), targets.to(dev).chunk(m)
    box = _Mailbox(mesh, dev)
    saved: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
    loss_sum = torch.zeros((), dtype=torch.promote_types(boundary_dtype, torch.float32), device=dev)
    timeline: list[tuple[Action, float, float]] = []
    for action in schedule.actions(p, me):
        mb, c = action.microbatch, action.chunk
        stage = c * p + me
        tag = 2 * (mb * num_stages + stage)
        if action.kind == "F":
            if stage == 0:
                x = xs[mb]
            else:
                x = box.recv(shape, boundary_dtype, stage_rank(stage - 1, p)[0], tag)
                x.requires_grad_(True)
            start = time.perf_counter()
            with torch.profiler.record_function("pipeline::forward"):
                out = chunks[c](x, ts[mb]) if stage == last else chunks[c](x)
            if stage == last:
                if out.dim() != 0:
                    raise ConfigError("the last pipeline stage must return a scalar loss")
                loss_sum += out.detach().to(loss_sum.dtype)
                out = out / m if loss_scale == 1.0 else out * (loss_scale / m)
            saved[(mb, c)] = (x, out)
            timeline.append((action, start, time.perf_counter()))
            if stage != last:
                box.send(out, stage_rank(stage + 1, p)[0], tag + 2)
        else:
            x, out = saved.pop((mb, c))
            grad = None
            if stage != last:
                grad = box.recv(tuple(out.shape), out.dtype, stage_rank(stage + 1, p)[0], tag + 3)
            start = time.perf_counter()
            with torch.profiler.record_function("pipeline::backward"):
                torch.autograd.backward(out, grad)
            timeline.append((action, start, time.perf_counter()))
            if stage != 0:
                box.send(x.grad, stage_rank(stage - 1, p)[0], tag + 1)
            del x, out, grad
    box.flush()
    _sum_tied_grads(tied, mesh)
    loss = mesh.comm.broadcast(loss_sum / m, AXIS, src=stage_rank(last, p)[0])
    return PipelineResult(loss=loss, timeline=timeline)


def _device_of(chunks: Sequence[nn.Module], inputs: torch.Tensor) -> torch.device:
    for chunk in chunks:
        for p in chunk.parameters():
            return p.device
    return inputs.device


def _sum_tied_grads(tied: Sequence[nn.Parameter], mesh: ProcessMesh) -> None:
    """Swap the tied gradients between the first and last rank; both keep the sum."""
    p, me = mesh.size(AXIS), mesh.coord(AXIS)
    if p == 1 or not tied:
        return
    peer = p - 1 - me
    mine = [(q.grad if q.grad is not None else torch.zeros_like(q)).contiguous() for q in tied]
    theirs = [torch.empty_like(g) for g in mine]
    works = exchange(
        mesh.comm,
        AXIS,
        sends=[(g, peer, _TIED_TAG + i) for i, g in enumerate(mine)],
        recvs=[(g, peer, _TIED_TAG + i) for i, g in enumerate(theirs)],
    )
    wait_all(works)
    for q, a, b in zip(tied, mine, theirs):
        q.grad = a + b if me == 0 else b + a  # first + last on both ranks: identical bits
