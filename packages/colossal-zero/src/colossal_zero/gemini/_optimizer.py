"""The Gemini optimizer: Adam/AdamW on the fp32 shards of a ``GeminiModule``'s chunks.

[Note: shard update] For every parameter this rank holds a slice of (in its shard), the update
reads the slice's reduced gradient (from the "acc" chunk after accumulation, else the working
buffer: the low-precision parameter chunk with masters, the fp32 "grad" chunk without), updates
the fp32 slice (master, or the parameter itself in fp32) with the exp_avg / exp_avg_sq chunks on
the tier where they live (``adamw_update``; [Note: state placement]), chunk by chunk so that
staging copies never exceed one chunk, then refreshes the low-precision parameters from the
masters. Gradient clipping and fp16 overflow checks use the norm over all shards of all ranks,
and over the tensor-parallel axes that ``sharding`` names ([Note: mesh-wide norms]).

[Note: one fused call] Chunks whose update moves and stages nothing (their fp32 values,
gradients and states already on one device, no disk tier) are updated together: one
``adamw_update`` per param group over all their tensors instead of one per chunk. The kernel
updates every element on its own, so the values are those of the chunk-by-chunk update.

[Note: norm on demand] Only clipping and the fp16 loss scaler need the gradient norm before
the update. Without either, on one rank without tensor-parallel axes and when every chunk is
updated in place, ``step`` does not compute it: ``last_grad_norm`` computes it when first read,
from the step's gradient pieces (the same pieces, so the same value), which stay valid until
``zero_grad`` or the next forward; a later first read is an error. Without either and with a
disk tier, each chunk's squares are taken as its update set streams through memory (its
gradients are read then anyway) and reduced after the last update: gradients on disk are read
once per step, not once for the norm and again for the update (same pieces in the same order,
so the same value).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch

from colossal_chunk import UNLIMITED, AutoPolicy, Chunk, trim_host_heap
from colossal_contracts import ConfigError, ParamSharding, TierName

from ..optim._adam import AdamHyper
from ..optim._clip import ClippedAdam
from ..optim._from_torch import adam_arguments
from ..optim._mesh_norm import piece_squares, reduce_squares
from ._chunk_update import STATE_KINDS, ChunkUpdates, Rows
from ._module import GeminiModule
from ._setup import chunk_numels, working_set_bytes
from ._state_placement import StatePlan, plan_states
from ._update_in_backward import Squares, UpdateInBackward, check_update_in_backward

__all__ = ["GeminiOptimizer"]

ACC = TierName.ACCELERATOR


class GeminiOptimizer(ClippedAdam):
    """Adam/AdamW for a ``GeminiModule``; see [Note: shard update].

    ``params`` are the module's parameters or param groups (as for ``torch.optim.AdamW``);
    ``max_grad_norm > 0`` clips the global gradient norm. With fp16, ``backward(loss)`` scales the
    loss and ``step`` skips steps whose gradients overflow (see [Note: loss scaling]).
    ``sharding`` (parameter name -> ``ParamSharding``) says which parameters are split along or
    replicated over other mesh axes, so norm and overflow agree over the whole mesh.
    """

    def __init__(
        self,
        model: GeminiModule,
        params: Iterable[torch.Tensor] | Iterable[dict] | None = None,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
        *,
        max_grad_norm: float = 0.0,
        adamw: bool = True,
        sharding: Mapping[str, ParamSharding] | None = None,
    ):
        if not isinstance(model, GeminiModule):
            raise ConfigError("GeminiOptimizer needs the GeminiModule that apply_gemini returned")
        rt = model.runtime
        super().__init__(
            list(params) if params is not None else model.parameters(),
            lr,
            betas,
            eps,
            weight_decay,
            adamw=adamw,
            max_grad_norm=max_grad_norm,
            loss_scaler=rt.config.loss_scaler if rt.precision.loss_scaling else None,
        )
        self.model, self.rt = model, rt
        self.sharding: dict[str, ParamSharding] = dict(sharding or {})
        group_of: dict[str, int] = {}  # parameter name -> param group index
        for gi, group in enumerate(self.param_groups):
            for p in group["params"]:
                name = self.rt.names.get(id(p))
                if name is None:
                    raise ConfigError(
                        f"a parameter of shape {tuple(p.shape)} given to GeminiOptimizer is not "
                        "managed by this GeminiModule; pass model.parameters() or groups of them"
                    )
                group_of[name] = gi
        for kind in STATE_KINDS:
            rt.manager.add_parallel(
                kind, rt.precision.state_dtype, spill_reserve=self._spill_reserve()
            )
        self._grad_norm = 0.0
        # the runtime holds what this keeps after a step ([Note: norm on demand], the joined
        # chunks' views) and lets it go as the next forward begins
        self._after = rt.after_step
        self.updates = ChunkUpdates(rt, group_of, self._hyper, self._after.views)
        if rt.config.states_placement == "host":  # [Note: state placement]: host for good
            rt.read_gradients_with(STATE_KINDS[0])
        self.state_plan = StatePlan(0, (), 0)  # [Note: state placement]
        self._tracking_for: object = None  # the chunk layout whose demand is being measured
        self._placed_for: object = None  # the chunk layout the states were placed for
        setting = rt.config.update_in_backward  # [Note: update in backward]
        allowed = check_update_in_backward(
            setting, max_grad_norm=max_grad_norm, loss_scaling=rt.precision.loss_scaling
        )
        disk = TierName.DISK in rt.manager.books.tiers
        self._in_backward = UpdateInBackward(
            self, allowed=allowed and (disk or setting is True), auto=setting is None
        )
        rt.register_update_hooks(self._in_backward)

    @classmethod
    def from_torch(
        cls,
        model: GeminiModule,
        optimizer: torch.optim.Optimizer,
        *,
        max_grad_norm: float = 0.0,
        sharding: Mapping[str, ParamSharding] | None = None,
    ) -> GeminiOptimizer:
        """The Gemini equivalent of a ``torch.optim.Adam``/``AdamW`` built on ``model``'s params."""
        groups, kwargs = adam_arguments(optimizer, who="Gemini")
        return cls(model, groups, max_grad_norm=max_grad_norm, sharding=sharding, **kwargs)

    @property
    def steps(self) -> dict[str, torch.Tensor]:
        """Each parameter's Adam step count (float32 scalars) by name."""
        return self.updates.steps

    def _hyper(self, gi: int) -> AdamHyper:
        return AdamHyper.from_group(self.param_groups[gi], adamw=self.adamw)

    @property
    def last_grad_norm(self) -> float:
        """The unscaled global gradient norm of the last step (see [Note: norm on demand]: read
        it before ``zero_grad`` and the next forward when nothing else needed it)."""
        due = self._after.norm_due
        if due is not None:
            parts, forwards = due
            if forwards != self.rt.forwards:
                raise ConfigError(
                    "GeminiOptimizer.last_grad_norm was first read after zero_grad or the next forward; "
                    "without clipping or a loss scaler the norm is computed when read: read it "
                    "right after step()"
                )
            self._after.norm_due = None
            self._grad_norm = reduce_squares(piece_squares(parts)).norm
        return self._grad_norm

    @contextmanager
    def accumulating(self) -> Iterator[None]:
        """Backwards inside are earlier micro-batches of a gradient accumulation: their
        gradients wait for the next backward, and the update runs in the first backward outside
        (or in ``step``); see [Note: update in backward]. Without an update in backward it
        changes nothing."""
        with self._in_backward.accumulating():
            yield

    @property
    def states_placed(self) -> bool:
        """Whether the Adam states are where they stay for this chunk layout ([Note: state
        placement]): no step is measured for their placement."""
        rt = self.rt
        if rt.config.states_placement == "host" or not isinstance(rt.policy, AutoPolicy):
            return True
        return self._placed_for is rt.manager.groups

    def backward(self, loss: torch.Tensor) -> None:
        """``ClippedAdam.backward``; when backward raises (the refusal right after the warmup:
        [Note: feasibility rule]), the recorders' dispatch modes are removed here, outside
        backward, since no next forward will remove them."""
        try:
            super().backward(loss)
        except BaseException:
            self.rt.close_recorders()
            raise

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget collected gradients (restoring parameters whose storage held them)."""
        self._in_backward.zero_grad()
        if self._after.norm_due is not None:  # [Note: norm on demand]: its pieces go too
            self._after.norm_due = ([], -1)
        self.rt.clear_grads()

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with self._in_backward.closure(), torch.enable_grad():
                loss = closure()
        rt, m, up = self.rt, self.rt.manager, self.updates
        fused = self._in_backward.stepped()  # [Note: update in backward]: chunk id -> squares
        if m.books.tiers[TierName.HOST].capacity_bytes < UNLIMITED:  # [Note: bounded host heap]
            trim_host_heap()  # the heap backward freed (activations) leaves before the update
        self._place_states()
        todo: list[tuple[Chunk, list[str]]] = []  # chunks with gradients, their owned names
        norm_parts: list[tuple[Chunk | None, list[tuple[torch.Tensor, ParamSharding | None]]]] = []
        counts: list[torch.Tensor] = []  # step counts of every tensor with a gradient
        pieces: dict[int, list[torch.Tensor]] = {}  # chunk id -> gradient slices of its owned
        disk = TierName.DISK in m.books.tiers  # without a disk tier there is nothing to stream
        for c in (g.param for g in m.groups.values() if not g.param.frozen):  # frozen: no grads
            item = None if c.chunk_id in fused else up.owned_and_steps(c)
            if item is None:  # no gradient, or updated in backward
                continue
            owned, steps = item
            counts += steps
            got_pieces = pieces[c.chunk_id] = rt.grad_pieces(c, owned) if owned else []
            parts = [(g, self.sharding.get(n)) for n, g in zip(owned, got_pieces, strict=True)]
            todo.append((c, owned))
            norm_parts.append((rt.gradients(c) if disk else None, parts))
        in_place = {c.chunk_id for c, _ in todo if up.in_place(c, pieces[c.chunk_id], disk)}
        scale = self.loss_scale
        streamed: dict[int, Squares] | None = None  # squares taken as chunks stream through
        # [Note: norm on demand]: without clipping or a scaler nothing needs it before the update
        not_first = self.max_grad_norm == 0 and self.scaler is None
        alone = rt.world_size == 1 and not self.sharding and len(in_place) == len(todo)
        if not_first and alone and not fused:
            self._after.norm_due = ([p for _, parts in norm_parts for p in parts], rt.forwards)
            overflow = False
        elif not_first and (disk or fused):
            self._after.norm_due, overflow, streamed = None, False, {}
        else:
            found = reduce_squares(
                self._squares(norm_parts), group=rt.group, shardings=self.sharding
            )
            self._after.norm_due = None
            self._grad_norm, overflow = found.norm / scale, found.overflow
        if self._skip(overflow):
            rt.clear_grads()
            return loss
        grad_scale = self._divisor(lambda: self.last_grad_norm)
        if counts:
            torch._foreach_add_(counts, 1.0)
        rows: Rows = {}  # [Note: one fused call]: param group -> its tensors
        joined: list[Chunk] = []  # the chunks in rows
        moving = False  # a chunk updated alone may move others: the rest go alone too
        # chunks on disk stream through memory: the manager reads ahead each update set and up
        # to two after it, and writes behind each one updated (colossal-chunk's [Note: shards
        # to update]); the fast case, joined chunks, needs none of it
        plan = up.plan(grad_scale)
        for i, ((c, owned), turn) in enumerate(m.shard_io.shards_to_update(todo, plan)):
            if c.chunk_id in in_place and not moving:
                if streamed is not None:
                    streamed[c.chunk_id] = piece_squares(norm_parts[i][1])
                up.join(c, owned, pieces[c.chunk_id], rows)
                joined.append(c)
                continue
            moving = True
            up.run(rows, joined, grad_scale)  # first the joined ones before it
            if streamed is not None:  # this chunk's pieces now (moves may have replaced views)
                got = rt.grad_pieces(c, owned)
                streamed[c.chunk_id] = piece_squares(
                    (g, self.sharding.get(n)) for n, g in zip(owned, got, strict=True)
                )
            with turn.running():  # staged, brought where the states live
                up.update(c, owned, grad_scale)
            rt.stepped(c)
        up.run(rows, joined, grad_scale)
        if streamed is not None:  # in chunk order, those updated in backward among them
            streamed.update(fused)
            squares = [s for cid in m.groups if cid in streamed for s in streamed[cid]]
            found = reduce_squares(squares, group=rt.group, shardings=self.sharding)
            self._grad_norm = found.norm / scale
        for cid in [cid for cid in up.views if cid not in in_place or moving]:
            del up.views[cid]  # moved or re-packed (or maybe, in a step that moved); the
        # rest go as the next forward begins when that step may move shards (AfterStep)
        rt.clear_grads()
        self._stepped()
        return loss

    def _squares(
        self, per_chunk: list[tuple[Chunk | None, list[tuple[torch.Tensor, ParamSharding | None]]]]
    ) -> list[tuple[float, bool]]:
        """Each chunk's gradient pieces' squared norms (one ``piece_squares`` per chunk), then the
        chunk is let go: on disk its mapped pages leave memory (read all at once, every gradient
        on disk was resident)."""
        if all(grads is None for grads, _ in per_chunk):  # nothing on disk: one call for all
            return piece_squares([p for _, parts in per_chunk for p in parts])
        out: list[tuple[float, bool]] = []
        for grads, parts in per_chunk:
            out += piece_squares(parts)
            if grads is not None:  # a disk tier (else nothing to let go)
                self.rt.manager.shard_io.read_done([grads])
        return out

    def _update_bytes(self, c: Chunk) -> int:
        """Accelerator bytes ``c``'s update needs beside its states: fp32 values and gradients
        that are not among them."""
        roles = self.rt.roles
        extra = [roles.working(c)] + ([] if self.rt.precision.master else [c])
        return sum(ch.shard_bytes for ch in extra)

    def _spill_reserve(self) -> int | None:
        """States that fit on neither host nor disk may start on the accelerator (kept there)
        while two chunks' working sets stay free ([Note: state placement]); auto placement only."""
        cfg, rt = self.rt.config, self.rt
        if cfg.placement != "auto" or cfg.states_placement == "host":
            return None
        ws, (numel, frozen_numel) = rt.world_size, chunk_numels(rt.manager.groups)
        frozen = working_set_bytes(frozen_numel, rt.precision, ws, frozen=True)
        return 2 * max(working_set_bytes(numel, rt.precision, ws), frozen)

    def _place_states(self) -> None:
        """See [Note: state placement]: measure one step once the compute order is known, then
        move the states of the chunks that fit to the accelerator and keep them there."""
        m, mode, policy = self.rt.manager, self.rt.config.states_placement, self.rt.policy
        warm = isinstance(policy, AutoPolicy) and policy.warm
        if mode == "host" or self._placed_for is m.groups or not warm:
            return
        if self._tracking_for is not m.groups:  # (re)start: the layout is new or not measured
            m.books.track_demand()
            self._tracking_for = m.groups
            return
        m.settle()
        self.state_plan = plan_states(m, policy, self.updates.states_of, self._update_bytes, mode)
        m.books.track_demand(False)
        for cid in self.state_plan.chunks:
            states = self.updates.states_of(m.groups[cid].param)
            for ch in states:  # each kept as it lands, so the next move cannot evict it
                m.move(ch, ACC, keep=True)
        self._placed_for = m.groups
        # a chunk's update reads its gradients where its states live for good: a gradient shard
        # on the accelerator would be copied to them anyway. Not before the plan: the step that
        # measures the demand sees gradients where it did before, and so plans the same.
        self.rt.read_gradients_with(STATE_KINDS[0], layout=m.groups)
