"""The Gemini optimizer: Adam/AdamW on the fp32 shards of a ``GeminiModule``'s chunks.

[Note: shard update] For every parameter this rank holds a slice of (in its shard), the update
reads the slice's reduced gradient (from the "acc" chunk after accumulation, else the working
buffer: the low-precision parameter chunk with masters, the fp32 "grad" chunk without), updates
the fp32 slice (master, or the parameter itself in fp32) with the exp_avg / exp_avg_sq chunks on
the tier where they live (``adamw_update``; [Note: state placement]), chunk by chunk so that
staging copies never exceed one chunk, then refreshes the low-precision parameters from the
masters. Gradient clipping and fp16 overflow checks use the norm over all shards of all ranks,
and over the tensor-parallel axes that ``sharding`` names ([Note: mesh-wide norms]).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

from colossal_chunk import AutoPolicy, Chunk
from colossal_contracts import ConfigError, ParamSharding, TierName

from ._adam import AdamHyper, adamw_update
from ._mesh_norm import piece_squares, reduce_squares
from ._module import GeminiModule
from ._scaler import DynamicLossScaler
from ._setup import working_set_bytes
from ._state_placement import StatePlan, plan_states

__all__ = ["GeminiOptimizer"]

STATE_KINDS = ("exp_avg", "exp_avg_sq")
ACC = TierName.ACCELERATOR


class GeminiOptimizer(torch.optim.Optimizer):
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
        if max_grad_norm < 0:
            raise ConfigError(f"max_grad_norm must be >= 0 (0: no clipping), got {max_grad_norm}")
        AdamHyper(lr, betas, eps, weight_decay, adamw)
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}
        super().__init__(list(params) if params is not None else model.parameters(), defaults)
        self.model, self.rt = model, model.runtime
        self.adamw, self.max_grad_norm = adamw, max_grad_norm
        self.sharding: dict[str, ParamSharding] = dict(sharding or {})
        self.group_of: dict[str, int] = {}
        for gi, group in enumerate(self.param_groups):
            for p in group["params"]:
                name = self.rt.names.get(id(p))
                if name is None:
                    raise ConfigError(
                        f"a parameter of shape {tuple(p.shape)} given to GeminiOptimizer is not "
                        "managed by this GeminiModule; pass model.parameters() or groups of them"
                    )
                self.group_of[name] = gi
        for kind in STATE_KINDS:
            self.rt.manager.add_parallel(kind, torch.float32, spill_reserve=self._spill_reserve())
        self.steps: dict[str, torch.Tensor] = {}  # name -> float32 scalar step count
        prec = self.rt.precision
        self.scaler = DynamicLossScaler(self.rt.config.loss_scaler) if prec.loss_scaling else None
        self.last_grad_norm: float = 0.0
        self.state_plan = StatePlan(0, (), 0)  # [Note: state placement]
        self._tracking_for: object = None  # the chunk layout whose demand is being measured
        self._placed_for: object = None  # the chunk layout the states were placed for
        self.skipped_last: bool = False

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
        if not isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW):
            raise ConfigError(
                f"Gemini trains with Adam or AdamW, got {type(optimizer).__name__}; build the "
                "optimizer as torch.optim.AdamW(...)"
            )
        d = optimizer.defaults
        if d.get("amsgrad") or d.get("maximize"):
            raise ConfigError("Gemini's Adam supports neither amsgrad nor maximize; turn them off")
        groups = [
            {k: v for k, v in g.items() if k in ("params", "lr", "betas", "eps", "weight_decay")}
            for g in optimizer.param_groups
        ]
        return cls(
            model,
            groups,
            lr=d["lr"],
            betas=d["betas"],
            eps=d["eps"],
            weight_decay=d["weight_decay"],
            max_grad_norm=max_grad_norm,
            adamw=isinstance(optimizer, torch.optim.AdamW),
            sharding=sharding,
        )

    @property
    def loss_scale(self) -> float:
        return self.scaler.scale if self.scaler is not None else 1.0

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``, scaled by the loss scale under fp16."""
        (loss * self.loss_scale if self.scaler is not None else loss).backward()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget collected gradients (restoring parameters whose storage held them)."""
        self.rt.clear_grads()

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        loss = closure() if closure is not None else None
        rt, m = self.rt, self.rt.manager
        self._place_states()
        todo: list[tuple[Chunk, list[str]]] = []  # chunks with gradients, their owned names
        norm_parts: list[tuple[Chunk, list[tuple[torch.Tensor, ParamSharding | None]]]] = []
        elsewhere: list[torch.Tensor] = []  # step counts of tensors other ranks hold
        for c in m.param_chunks():
            names = [n for n in c.records if n in rt.got_grad and n in self.group_of]
            if not names:
                continue
            grads, fp32 = rt.gradients(c), rt.roles.fp32(c)
            owned, parts = [], []
            for n in names:
                # every rank counts every tensor's steps: after a re-pack in first-use order
                # ([Note: first-use order]) a rank may come to hold a slice it did not hold
                step = self.steps.get(n)
                if step is None:
                    step = self.steps[n] = torch.zeros((), dtype=torch.float32)
                if fp32.shard_view(n) is None:
                    elsewhere.append(step)
                    continue
                owned.append(n)
                parts.append((grads.shard_view(n)[0], self.sharding.get(n)))  # type: ignore[index]
            todo.append((c, owned))
            norm_parts.append((grads, parts))
        found = reduce_squares(self._squares(norm_parts), group=rt.group, shardings=self.sharding)
        scale = self.loss_scale
        self.last_grad_norm = found.norm / scale
        self.skipped_last = self.scaler is not None and found.overflow
        if self.skipped_last:
            self.scaler.update(True)  # type: ignore[union-attr]
            rt.clear_grads()
            return loss
        grad_scale = scale
        if self.max_grad_norm > 0:
            coef = self.max_grad_norm / (self.last_grad_norm + 1e-6)
            if coef < 1.0:
                grad_scale = scale / coef
        for s in elsewhere:
            s += 1
        for n in {n for _, owned in todo for n in owned}:
            self.steps[n] += 1
        disk = TierName.DISK in m.tiers  # without a disk tier there is nothing to stream
        for i, (c, owned) in enumerate(todo):  # chunks on disk stream through memory: read
            # ahead two chunks, write behind each one updated (colossal-chunk's
            # [Note: disk read-ahead and write-behind])
            if disk:
                for ahead, _ in todo[i : i + 3] if i == 0 else todo[i + 2 : i + 3]:
                    m.read_ahead(self._written_by(ahead))
            self._update(c, owned, grad_scale)
            rt.stepped(c)
            if disk:
                m.written(self._written_by(c))
        rt.clear_grads()
        if self.scaler is not None:
            self.scaler.update(False)
        return loss

    def _update(self, c: Chunk, names: list[str], grad_scale: float) -> None:
        """Adam on chunk ``c``'s fp32 slices ``names``, where its states live ([Note: state
        placement]): on the accelerator its fp32 values and gradients are moved there first
        (counted moves); on the host they are staged through copies of this one chunk (counted)
        and the values written back."""
        rt, m = self.rt, self.rt.manager
        avg, sq = (m.parallel_chunk(k, c) for k in STATE_KINDS)
        home = avg.tier
        fp32, grads = rt.roles.fp32(c), rt.gradients(c)
        states = self._states_of(c)
        held = [ch for ch in dict.fromkeys((fp32, grads)) if ch not in states]
        if home is ACC:  # bring values and gradients over; neither may evict the other
            for ch in (fp32, grads):
                if ch.tier is not ACC:
                    m.move(ch, ACC)
                if ch in held:
                    m.keep_on_compute([ch])
        dev = avg.shard.device  # type: ignore[union-attr]
        rows: dict[int, tuple[list, list, list, list, list]] = {}
        write_back: list[tuple[torch.Tensor, torch.Tensor]] = []
        for n in names:
            pv = fp32.shard_view(n)[0]  # type: ignore[index]
            gv = grads.shard_view(n)[0]  # type: ignore[index]
            if fp32.tier is not home:  # update where the states live, then copy back
                nbytes = pv.numel() * pv.element_size()
                m.count_copy(fp32.tier, home, nbytes)  # type: ignore[arg-type]
                m.count_copy(home, fp32.tier, nbytes)  # type: ignore[arg-type]
                staged = pv.to(dev)
                if staged is not pv:
                    write_back.append((pv, staged))
                pv = staged
            if grads.tier is not home:
                m.count_copy(grads.tier, home, gv.numel() * gv.element_size())  # type: ignore[arg-type]
            if gv.device != dev or gv.dtype != torch.float32:
                gv = gv.to(dev, torch.float32)
            row = rows.get(self.group_of[n])
            if row is None:
                row = rows[self.group_of[n]] = ([], [], [], [], [])
            row[0].append(pv)
            row[1].append(gv)
            row[2].append(avg.shard_view(n)[0])  # type: ignore[index]
            row[3].append(sq.shard_view(n)[0])  # type: ignore[index]
            row[4].append(self.steps[n])
        for gi, (ps, gs, avgs, sqs, steps) in rows.items():
            hyper = AdamHyper.from_group(self.param_groups[gi], adamw=self.adamw)
            adamw_update(ps, gs, avgs, sqs, steps, hyper, grad_scale=grad_scale)
        for dst, src in write_back:
            dst.copy_(src)
        if home is ACC:
            m.keep_on_compute(held, keep=False)

    def _written_by(self, c: Chunk) -> list[Chunk]:
        """The chunks whose shards the update of ``c`` writes (fp32 values, states, ``c``), and
        the gradients it reads: on disk, their mapped pages must leave memory the same way."""
        grads = self.rt.gradients(c)
        return list(dict.fromkeys((self.rt.roles.fp32(c), *self._states_of(c), c, grads)))

    def _squares(
        self, per_chunk: list[tuple[Chunk, list[tuple[torch.Tensor, ParamSharding | None]]]]
    ) -> list[tuple[float, bool]]:
        """Each chunk's gradient pieces' squared norms (one ``piece_squares`` per chunk), then the
        chunk is let go: on disk its mapped pages leave memory (read all at once, every gradient
        on disk was resident)."""
        out: list[tuple[float, bool]] = []
        for grads, parts in per_chunk:
            out += piece_squares(parts)
            self.rt.manager.written([grads])
        return out

    def _states_of(self, c: Chunk) -> list[Chunk]:
        """The chunks that live where ``c``'s Adam states live (the masters with them)."""
        m = self.rt.manager
        kinds = (*STATE_KINDS, "master") if self.rt.precision.master else STATE_KINDS
        return [m.parallel_chunk(k, c) for k in kinds]

    def _update_bytes(self, c: Chunk) -> int:
        """Accelerator bytes ``c``'s update needs beside its states: fp32 values and gradients
        that are not among them."""
        roles = self.rt.roles
        extra = [roles.working(c)] + ([] if self.rt.precision.master else [c])
        return sum(ch.shard_bytes for ch in extra)

    def _spill_reserve(self) -> int | None:
        """States that fit on neither host nor disk may start on the accelerator (kept there)
        while two chunks' working sets stay free ([Note: state placement]); auto placement only."""
        cfg, m = self.rt.config, self.rt.manager
        if cfg.placement != "auto" or cfg.states_placement == "host":
            return None
        return 2 * working_set_bytes(m.chunk_numel, self.rt.precision, m.world_size)

    def _place_states(self) -> None:
        """See [Note: state placement]: measure one step once the compute order is known, then
        move the states of the chunks that fit to the accelerator and keep them there."""
        m, mode = self.rt.manager, self.rt.config.states_placement
        warm = isinstance(m.policy, AutoPolicy) and m.policy.warm
        if mode == "host" or self._placed_for is m.chunks or not warm:
            return
        if self._tracking_for is not m.chunks:  # (re)start: the layout is new or not measured
            m.track_demand()
            self._tracking_for = m.chunks
            return
        m.settle()
        self.state_plan = plan_states(m, self._states_of, self._update_bytes, mode)
        m.track_demand(False)
        for cid in self.state_plan.chunks:
            states = self._states_of(m.chunks[cid])
            for ch in states:  # each kept as it lands, so the next move cannot evict it
                m.move(ch, ACC)
                m.keep_on_compute([ch])
        self._placed_for = m.chunks
