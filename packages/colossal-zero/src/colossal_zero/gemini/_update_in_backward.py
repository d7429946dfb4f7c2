"""Gemini's Adam update in backward: each chunk is updated as soon as its gradients are reduced.

[Note: update in backward] When nothing needs the gradient norm before the update (no
clipping, no fp16 loss scaler), no closure re-runs the step, and the backward is the last of
its step, the optimizer updates each chunk right after its gradients are reduced (after the
next chunk's when the reduce-scatter is still in flight, so that it overlaps that chunk's
backward): ``step``'s own update (``_update`` through ``shards_to_update``) with the same step
counts and the param group's weight decay and lr, then the gradients are dropped (the phase
goes to EMPTY, a "grad" chunk's values dead: colossal-chunk's [Note: dead shards]). So with a
disk tier no reduced gradient is written to disk and read back for the step. ``step`` updates
what is left (chunks not reduced in backward, or whose update would bring shards onto the
compute tier, whose room is planned for the backward's moments) and reduces the norm from the
squares taken as each chunk was updated, in chunk order ([Note: norm on demand]). Every value
is the unfused step's: Adam updates each element on its own. The lr is the group's when the
chunk is updated: a scheduler steps after ``optimizer.step()``, so the next backward sees the
lr the unfused step would use.

The last backward is one outside ``GeminiOptimizer.accumulating()`` (earlier micro-batches run
inside it, as in DDP's ``no_sync``). Automatic mode (``update_in_backward=None``) stops for
good after a step with two backwards outside it (undeclared accumulation: the last is unknown).
A backward, ``zero_grad`` or ``step(closure)`` after a backward that updated chunks and before
``step`` is a ``ConfigError``: an update cannot be undone. Not in the warmup or a measured step
(their memory is the plan's), nor before the states are placed ([Note: state placement]).
The runtime calls the optimizer only through ``UpdateHooks`` (``register_update_hooks``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Protocol

import torch

from colossal_chunk import Chunk
from colossal_contracts import ConfigError, TierName

from ..optim._mesh_norm import piece_squares
from ._hooks import label

if TYPE_CHECKING:
    from ._optimizer import GeminiOptimizer

__all__ = ["NO_HOOKS", "UpdateHooks", "UpdateInBackward", "check_update_in_backward"]

ACC = TierName.ACCELERATOR
Squares = list[tuple[float, bool]]


class UpdateHooks(Protocol):
    """What Gemini's runtime tells an optimizer in backward ([Note: update in backward]); each
    method does nothing unless an implementation overrides it."""

    def gradients_reduced(self, chunk: Chunk) -> None:
        """Parameter chunk ``chunk``'s gradients of this backward are reduced (the collective
        may still be in flight)."""

    def backward_ends(self) -> None:
        """Backward ended: every collective is finished."""


class _NoHooks(UpdateHooks):
    pass


NO_HOOKS: UpdateHooks = _NoHooks()


def check_update_in_backward(
    setting: bool | None, *, max_grad_norm: float, loss_scaling: bool
) -> bool:
    """Whether the update may run in backward at all for ``setting`` (``GeminiConfig.
    update_in_backward``); ``ConfigError`` when it is forced on where it cannot run."""
    why = []
    if max_grad_norm > 0:
        why.append(f"max_grad_norm={max_grad_norm} clips by the norm of every gradient")
    if loss_scaling:
        why.append("fp16's loss scaler checks every gradient for overflow")
    if setting and why:
        raise ConfigError(
            "update_in_backward=True cannot run: "
            + " and ".join(why)
            + " before any chunk is updated; set max_grad_norm=0 and precision 'bf16' or "
            "'fp32', or leave update_in_backward None (on where it can run) or False"
        )
    return setting is not False and not why


class UpdateInBackward(UpdateHooks):
    """The optimizer's side of [Note: update in backward]: composed into ``GeminiOptimizer``
    and registered with its runtime."""

    def __init__(self, opt: GeminiOptimizer, *, allowed: bool, auto: bool) -> None:
        self._opt = opt
        self._allowed, self._auto = allowed, auto
        self.squares: dict[int, Squares] = {}  # chunk id -> its squares, updated since a step
        self._pending: list[Chunk] = []  # reduced in this backward, not updated yet
        self._armed: bool | None = None  # this backward's decision (None: not made yet)
        self._accumulating = False  # inside ``accumulating()``
        self._backwards = 0  # backwards outside ``accumulating()`` since the last step
        self._closure = False  # a closure of ``step`` runs

    @contextmanager
    def accumulating(self) -> Iterator[None]:
        """See ``GeminiOptimizer.accumulating``."""
        self._accumulating = True
        try:
            yield
        finally:
            self._accumulating = False

    @contextmanager
    def closure(self) -> Iterator[None]:
        """A closure of ``step`` runs: its backward leaves the update to the step."""
        if self.squares:
            raise ConfigError(
                "GeminiOptimizer.step(closure) after a backward that already updated "
                f"{len(self.squares)} chunks (update_in_backward): pass no closure, or set "
                "GeminiConfig(update_in_backward=False)"
            )
        self._closure = True
        try:
            yield
        finally:
            self._closure = False

    def gradients_reduced(self, chunk: Chunk) -> None:
        if self._armed is None:
            self._armed = self._arm()
        if not self._armed:
            return
        if chunk.lifecycle.in_flight:  # its reduce-scatter: updated after the next chunk's
            pending, self._pending = self._pending, [chunk]
        else:
            pending, self._pending = [*self._pending, chunk], []
        if pending:
            self._update(pending)

    def backward_ends(self) -> None:
        if self._armed:
            pending, self._pending = self._pending, []
            self._update(pending)
        if self._armed is None and self.squares:  # a backward that reduced nothing
            self._arm()
        self._armed = None
        if not self._accumulating and not self._closure:
            self._backwards += 1

    def stepped(self) -> dict[int, Squares]:
        """The step began: the squares of the chunks updated in backward since the last step,
        by chunk id (given up: the step uses them)."""
        if self._backwards > 1:  # accumulation not declared: automatic mode stops for good
            self._allowed = self._allowed and not self._auto
        self._backwards = 0
        out, self.squares = self.squares, {}
        return out

    def zero_grad(self) -> None:
        """``zero_grad`` before ``step``: chunks already updated in backward cannot be undone."""
        if self.squares:
            raise ConfigError(
                f"zero_grad() after a backward that already updated {len(self.squares)} chunks "
                "(update_in_backward) but before step(): call step() to finish the update; to "
                "skip steps, set GeminiConfig(update_in_backward=False)"
            )

    def _arm(self) -> bool:
        """Whether this backward updates chunks ([Note: update in backward])."""
        if self.squares:
            raise ConfigError(
                f"a backward after one that already updated {len(self.squares)} chunks "
                "(update_in_backward) before step(): it would accumulate gradients onto updated "
                "weights. Run the earlier micro-batches inside `with optimizer.accumulating():`, "
                "or set GeminiConfig(update_in_backward=False)"
            )
        opt = self._opt
        if not self._allowed or self._accumulating or self._closure or opt.rt.measuring:
            return False
        if self._auto and self._backwards > 0:  # a second backward outside accumulating()
            self._allowed = False
            return False
        return opt.states_placed

    def _update(self, chunks: list[Chunk]) -> None:
        """Update ``chunks`` (their gradients reduced) as the step would; those whose update
        would bring chunks to the compute tier are left to the step."""
        opt, rt = self._opt, self._opt.rt
        todo: list[tuple[Chunk, list[str]]] = []
        counts: list[torch.Tensor] = []
        for c in chunks:
            got = opt._owned_and_steps(c)
            if got is None or self._brings(c):  # no gradient the optimizer steps; or later
                continue
            owned, steps = got
            counts += steps
            todo.append((c, owned))
            self.squares[c.chunk_id] = []  # updated, even if this rank owns nothing of it
        if counts:
            torch._foreach_add_(counts, 1.0)
        with torch.no_grad(), label("Gemini::update_in_backward"):
            m = rt.manager
            m.settle([ch for c, _ in todo for ch in (c, rt.working(c))])  # reductions in flight
            io = m.shard_io
            for (c, owned), turn in io.shards_to_update(todo, opt._plan(1.0)):
                got = rt.grad_pieces(c, owned) if owned else []
                self.squares[c.chunk_id] = piece_squares(
                    (g, opt.sharding.get(n)) for n, g in zip(owned, got, strict=True)
                )
                with turn.running():
                    opt._update(c, owned, 1.0)
                rt.stepped(c)

    def _brings(self, c: Chunk) -> bool:
        """Whether ``c``'s update moves chunks onto the compute tier (its states live there, its
        fp32 values or gradients do not): left to the step."""
        opt, rt = self._opt, self._opt.rt
        if opt._states_of(c)[0].tier is not ACC:
            return False
        return any(ch.tier is not ACC for ch in (rt.roles.fp32(c), rt.grad_home(c)))
