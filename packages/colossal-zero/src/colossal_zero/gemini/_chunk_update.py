"""How ``GeminiOptimizer`` updates one chunk's tensors ([Note: shard update], [Note: one fused
call] in ``_optimizer.py``): in place and joined into one fused call per param group, or alone
where its states live, with every staging copy counted.

``GeminiOptimizer`` inherits these methods; they read its runtime, param groups and step counts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from colossal_chunk import Chunk, ShardUpdate
from colossal_contracts import TierName

from ..optim._adam import STATE_KINDS, AdamHyper, adamw_update

__all__ = ["STATE_KINDS", "ChunkUpdates", "Rows"]

ACC = TierName.ACCELERATOR
Rows = dict[int, tuple[list[torch.Tensor], ...]]  # param group -> values, grads, m, v, steps


class ChunkUpdates:
    """The per-chunk update of ``GeminiOptimizer``; see the module docstring."""

    rt: Any  # the GeminiRuntime (the optimizer's)
    adamw: bool
    group_of: dict[str, int]  # parameter name -> param group index
    steps: dict[str, torch.Tensor]  # parameter name -> float32 step count
    param_groups: list[dict[str, Any]]
    _views: dict[int, tuple[tuple, tuple[str, ...], list[tuple]]]  # see _join

    def _owned_and_steps(self, c: Chunk) -> tuple[list[str], list[torch.Tensor]] | None:
        """Of chunk ``c``'s tensors with a gradient this step that the optimizer steps: those
        this rank holds a slice of, and the step count of every one (made at 0 when new); None
        when there are none. Every rank counts every tensor's steps: after a re-pack in first-use
        order ([Note: first-use order]) a rank may come to hold a slice it did not hold."""
        got, group_of = self.rt.got_grad, self.group_of
        names = [n for n in c.records if n in got and n in group_of]
        if not names:
            return None
        fp32, owned, counts = self.rt.roles.fp32(c), [], []
        for n in names:
            step = self.steps.get(n)
            if step is None:
                step = self.steps[n] = torch.zeros((), dtype=torch.float32)
            counts.append(step)
            if fp32.shard_view(n) is not None:
                owned.append(n)
        return owned, counts

    def _in_place(self, c: Chunk, grads: list[torch.Tensor], disk: bool) -> bool:
        """Whether chunk ``c``'s update moves and stages nothing ([Note: one fused call]): no disk
        tier, states on the host or everything already on the accelerator, one device, fp32."""
        if disk:
            return False
        rt, m = self.rt, self.rt.manager
        avg = m.groups[c.chunk_id].twin(STATE_KINDS[0])
        fp32 = rt.roles.fp32(c)
        if avg.tier is ACC and (fp32.tier is not ACC or rt.grad_home(c).tier is not ACC):
            return False
        dev = avg.shard.device
        if fp32.shard.device != dev:
            return False
        sd = rt.precision.state_dtype  # float32, or float64 under fp64
        return all(g.device == dev and g.dtype == sd for g in grads)

    def _join(self, c: Chunk, names: list[str], grads: list[torch.Tensor], rows: Rows) -> None:
        """Add chunk ``c``'s tensors (``names``, their gradient slices ``grads``) to ``rows``,
        counting the copies its tiers stand for as ``_update`` does. The views of its fp32 and
        state shards are kept from the last step while those shards stay the same tensors."""
        rt, m = self.rt, self.rt.manager
        avg, sq = (m.groups[c.chunk_id].twin(k) for k in STATE_KINDS)
        home, fp32, gtier = avg.tier, rt.roles.fp32(c), rt.grad_home(c).tier
        shards, key = (fp32.shard, avg.shard, sq.shard), tuple(names)
        hit = self._views.get(c.chunk_id)
        if hit is None or hit[1] != key or any(a is not b for a, b in zip(hit[0], shards)):
            per = [
                (self.group_of[n], *(ch.shard_view(n)[0] for ch in (fp32, avg, sq)), self.steps[n])
                for n in names
            ]
            hit = self._views[c.chunk_id] = (shards, key, per)
        for (gi, pv, av, sv, step), gv in zip(hit[2], grads, strict=True):
            if fp32.tier is not home:
                nbytes = pv.numel() * pv.element_size()
                m.books.count_copy(fp32.tier, home, nbytes)
                m.books.count_copy(home, fp32.tier, nbytes)
            if gtier is not home:
                m.books.count_copy(gtier, home, gv.numel() * gv.element_size())
            row = rows.get(gi)
            if row is None:
                row = rows[gi] = ([], [], [], [], [])
            row[0].append(pv)
            row[1].append(gv)
            row[2].append(av)
            row[3].append(sv)
            row[4].append(step)

    def _run(self, rows: Rows, joined: list[Chunk], grad_scale: float) -> None:
        """Update the joined chunks' tensors, one call per param group; empties both."""
        for gi, (ps, gs, avgs, sqs, steps) in rows.items():
            hyper = AdamHyper.from_group(self.param_groups[gi], adamw=self.adamw)
            adamw_update(ps, gs, avgs, sqs, steps, hyper, grad_scale=grad_scale)
        for c in joined:
            self.rt.stepped(c)
        rows.clear()
        joined.clear()

    def _plan(self, grad_scale: float) -> Callable[[tuple[Chunk, list[str]]], ShardUpdate]:
        """What the update of a chunk touches (colossal-chunk's [Note: shards to update]): it
        writes the fp32 values and the states (staged: updated in place) and the parameters
        (restored from the masters after), reads the gradients (written too when divided in
        place by ``grad_scale``), and computes where the states live: on the accelerator its
        fp32 values and gradients are brought there first (counted moves), held unless they are
        states."""

        def plan(item: tuple[Chunk, list[str]]) -> ShardUpdate:
            c, rt = item[0], self.rt
            fp32, states, grads = rt.roles.fp32(c), self._states_of(c), rt.gradients(c)
            written = tuple(dict.fromkeys((fp32, *states, c)))
            read: tuple[Chunk, ...] = ()
            if all(w is not grads for w in written):  # with masters: c's own slots
                if grad_scale == 1.0:
                    read = (grads,)
                else:
                    written += (grads,)  # divided in place
            return ShardUpdate(
                written,
                read,
                staged=tuple(dict.fromkeys((fp32, *states))),
                home=states[0],
                bring=(fp32, grads),
                hold=tuple(ch for ch in dict.fromkeys((fp32, grads)) if ch not in states),
            )

        return plan

    def _update(self, c: Chunk, names: list[str], grad_scale: float) -> None:
        """Adam on chunk ``c``'s fp32 slices ``names``, where its states live ([Note: state
        placement]), in its turn of ``shards_to_update`` (``_plan``: shards on disk are updated
        on host copies, colossal-chunk's [Note: staged updates]): off that tier its fp32 values
        and gradients are staged through copies of this one chunk (counted) and the values
        written back."""
        rt, m = self.rt, self.rt.manager
        avg, sq = (m.groups[c.chunk_id].twin(k) for k in STATE_KINDS)
        home = avg.tier
        fp32, grads = rt.roles.fp32(c), rt.gradients(c)
        dev = avg.shard.device
        rows: dict[int, tuple[list, list, list, list, list]] = {}
        write_back: list[tuple[torch.Tensor, torch.Tensor]] = []
        for n in names:
            pv = fp32.shard_view(n)[0]
            gv = grads.shard_view(n)[0]
            if fp32.tier is not home:  # update where the states live, then copy back
                nbytes = pv.numel() * pv.element_size()
                m.books.count_copy(fp32.tier, home, nbytes)
                m.books.count_copy(home, fp32.tier, nbytes)
                staged = pv.to(dev)
                if staged is not pv:
                    write_back.append((pv, staged))
                pv = staged
            if grads.tier is not home:
                m.books.count_copy(grads.tier, home, gv.numel() * gv.element_size())
            if gv.device != dev or gv.dtype != rt.precision.state_dtype:
                gv = gv.to(dev, rt.precision.state_dtype)
            row = rows.get(self.group_of[n])
            if row is None:
                row = rows[self.group_of[n]] = ([], [], [], [], [])
            row[0].append(pv)
            row[1].append(gv)
            row[2].append(avg.shard_view(n)[0])
            row[3].append(sq.shard_view(n)[0])
            row[4].append(self.steps[n])
        for gi, (ps, gs, avgs, sqs, steps) in rows.items():
            hyper = AdamHyper.from_group(self.param_groups[gi], adamw=self.adamw)
            adamw_update(ps, gs, avgs, sqs, steps, hyper, grad_scale=grad_scale)
        for dst, src in write_back:
            dst.copy_(src)

    def _states_of(self, c: Chunk) -> list[Chunk]:
        """The chunks that live where ``c``'s Adam states live (the masters with them)."""
        rec = self.rt.manager.groups[c.chunk_id]
        kinds = (*STATE_KINDS, "master") if self.rt.precision.master else STATE_KINDS
        return [rec.twin(k) for k in kinds]
