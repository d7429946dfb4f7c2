"""How Gemini's runtime collects gradients in backward: into chunk memory, reduce-scattered
chunk by chunk as they fill.

[Note: gradients in chunks] A parameter's post-accumulate-grad hook copies its gradient into chunk
memory and drops ``.grad``. Into the parameter's own slot of the chunk's gathered buffer (the
value is no longer needed in this backward) with fp32 masters (which restore it), and on more
than one rank in fp32 too: there the gathered buffer is a copy of every rank's shard, so the
shard still holds this rank's values, and the buffer is dropped without being copied back
(colossal-chunk's [Note: chunk gradients]). On one rank in fp32 the buffer *is* the shard, so
gradients go into a parallel fp32 "grad" chunk. When every tensor of the chunk is
READY_FOR_REDUCE it is reduce-scattered (averaged over data-parallel ranks) into this rank's
shard of the chunk that holds reduced gradients (``working``: the chunk itself with masters,
else its "grad" chunk). Sharded fp32 thus needs no gathered gradient buffer: a chunk in use in
backward holds its shard and gathered buffer, and the "grad" shard takes the result where it
lives (on the compute tier when there is room, else straight on the host). At the end of backward, tensors that got no gradient
(unused or frozen parameters) count as zeros so that every touched chunk is reduced, in chunk id
order on every rank (with ``GeminiConfig.overlap_comm`` without waiting: [Note: overlap] in
``_comm.py``). After the first backward, a chunk whose only missing tensors are trainable
parameters that no operator read (then or now) is reduced as soon as the others arrive, so an
unused parameter does not pin its chunk. Every rank must use the same parameters in a step.

[Note: gradients in parts] Setting a parameter's ``.data`` to a tensor on another device drops
its gradient accumulator (torch's ``set_data``), and the next operator that reads it makes a new
one. On CUDA a chunk evicted to the host between two readers of a parameter in one forward (a
tied embedding and output head) thus gives the parameter one accumulator per reader group, and
its post-accumulate-grad hook runs once per part (on an emulated accelerator both devices are
the CPU: one accumulator, one call). Collecting the first part would open the chunk's gradient
buffer at the last reader's backward and hold it in use through the backward of every operator
in between, and the next part would overwrite it. So the runtime counts each forward's readers
of a parameter (its ``_PreBackward`` wrappers, while their graph lives) and the backward of
each as it begins; a hook call while a reader's backward is still to come leaves the part in
``.grad``, where autograd adds the next part, and the call after the last reader's backward
collects the sum: the gradient is collected once, when it would have been with one accumulator.
A part whose remaining reader's backward never runs (its output kept but not used in the loss)
is collected at the end of backward. Readers count until a backward ends, so two forwards
summed into one backward count both.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from colossal_chunk import Chunk, ChunkManager, GradPhase
from colossal_contracts import TensorState

from ..optim._precision import Precision
from ._chunk_index import ChunkIndex
from ._grads import StepGradients
from ._hooks import label
from ._update_in_backward import NO_HOOKS, UpdateHooks

__all__ = ["GradientCollection"]

_S = TensorState
_G = GradPhase


class GradientCollection(StepGradients):
    """The runtime's gradient hooks and reductions in backward; ``GeminiRuntime`` is one."""

    manager: ChunkManager
    precision: Precision
    params: dict[str, nn.Parameter]  # registered name -> parameter
    group: dist.ProcessGroup | None
    world_size: int  # ranks in ``group``
    resident: bool  # [Note: resident steps] in ``_runtime.py``
    keeping: bool  # [Note: kept gradients] in ``_grads.py``
    index: ChunkIndex  # [Note: chunk index] in ``_chunk_index.py``: name -> its chunk
    _grad_done: set[str]  # names whose gradient this backward collected
    _readers: dict[str, int]  # name -> readers with backward to come ([Note: gradients in parts])
    _parts: set[str]  # names whose gradient waits in .grad for a later part (same note)
    _live: dict[int, tuple[tuple[str, ...], weakref.ref]]  # id(reader node) -> names, its ref
    _used: set[str]  # names an operator read since the forward began
    _overlap: bool  # [Note: overlap] in ``_comm.py``
    _start_backward: Callable[[], None]  # the runtime's: enters BACKWARD once per backward
    _recording: bool  # the warmup step runs
    _probing: bool | None  # a step measured by ``measure_next_step`` runs (True)
    _update_hooks: UpdateHooks = NO_HOOKS  # [Note: update in backward]

    def register_update_hooks(self, hooks: UpdateHooks) -> None:
        """Tell ``hooks`` (an optimizer's) of each chunk reduced in backward and of the end of
        backward ([Note: update in backward] in ``_update_in_backward.py``); one at a time."""
        self._update_hooks = hooks

    @property
    def measuring(self) -> bool:
        """Whether this step is measured (the warmup, or a probe): only the planned work runs."""
        return self._recording or self._probing is True

    def _settle_then_update(self) -> None:
        """End of backward: finish every collective in flight (the optimizer writes shards
        next), then the update hooks hear that backward ended."""
        self.manager.settle()
        self._update_hooks.backward_ends()

    def _grad_hook(self, name: str) -> Callable[[nn.Parameter], None]:
        # A weak reference: the hook lives in the parameter's C++ hook list, which the garbage
        # collector cannot see, so a strong one would keep the runtime (and its chunks) alive.
        ref = weakref.ref(self)

        def hook(p: nn.Parameter) -> None:
            rt = ref()
            if rt is None:
                return
            if rt.keeping:  # [Note: kept gradients]: no copy, nothing to reduce
                grad, p.grad = p.grad, None
                if grad is not None:
                    rt._keep(name, grad)
                return
            with label("Gemini::post_accumulate_grad"):
                rt._start_backward()
                if rt._readers.get(name, 0) > 0:  # [Note: gradients in parts]: more to come
                    rt._parts.add(name)
                    return
                rt._parts.discard(name)
                grad, p.grad = p.grad, None
                if grad is not None:
                    rt._collect(name, grad)

        return hook

    def count_reader(self, node: object, names: tuple[str, ...], *, forward: bool) -> None:
        """An operator of the forward (``forward``; not a recomputation in backward) that reads
        ``names`` got the ``_PreBackward`` ``node``: a reader whose backward is to come ([Note:
        gradients in parts]) while ``node`` lives (a graph dropped unused takes it along)."""
        if not forward:
            return
        readers, live, key = self._readers, self._live, id(node)
        for n in names:
            readers[n] = readers.get(n, 0) + 1

        def gone(_: object) -> None:  # the graph went without running this backward
            entry = live.pop(key, None)
            if entry is not None:
                _uncount(readers, entry[0])

        live[key] = (names, weakref.ref(node, gone))

    def reader_backward(self, node: object) -> None:
        """The backward of reader ``node`` (see ``count_reader``) begins."""
        entry = self._live.pop(id(node), None)
        if entry is not None:
            _uncount(self._readers, entry[0])

    def _drop_parts(self) -> None:
        """A forward begins after a backward that raised: its parts and readers go."""
        for n in self._parts:
            self.params[n].grad = None
        self._parts.clear()
        self._readers.clear()
        self._live.clear()

    def _collect_parts(self) -> None:
        """End of backward: gradients still waiting for a reader whose backward did not run (its
        output kept but not used) are collected now, in registration order (the same on every
        rank); the readers counted so far are done with."""
        self._readers.clear()
        self._live.clear()
        if not self._parts:
            return
        todo = [n for n in self.params if n in self._parts]
        self._parts.clear()
        for n in todo:
            grad, self.params[n].grad = self.params[n].grad, None
            if grad is not None:
                self._collect(n, grad)

    def _keep(self, name: str, grad: torch.Tensor) -> None:
        """Keep ``grad`` as ``name``'s gradient of this step ([Note: kept gradients])."""
        self._start_backward()
        cid = self.index.ids[name]
        group = self.manager.groups[cid]
        if group.grads is not _G.FILLING:  # the first this backward ([Note: kept gradients])
            if group.grads is _G.REDUCED:  # an earlier micro-batch's, not stashed by a forward
                self.stash(cid)
            group.grads = _G.FILLING  # REDUCED when backward ends (finish_kept)
        group.kept_grads[name] = grad
        self.got_grad.add(name)

    def _finish_kept(self) -> None:
        """A backward that kept gradients ended (or raised): the chunks that kept one hold this
        step's gradients as if reduced ([Note: kept gradients]; nothing else fills a chunk then)."""
        if self.keeping:
            for group in self.manager.groups.values():
                if group.grads is _G.FILLING:
                    group.grads = _G.REDUCED

    @property
    def _in_place(self) -> bool:
        """Gradients go into the parameter chunk's gathered buffer: with masters, or sharded."""
        return self.precision.master or self.world_size > 1

    def _collect(self, name: str, grad: torch.Tensor) -> None:
        c = self.index.chunk(name)
        if self._in_place:  # the parameter's own slot ([Note: gradients in chunks])
            if c.state(name) is not _S.COMPUTE:
                self.stash(c.chunk_id)
                self.manager.access([name])
            self._open(c)
            self.params[name].data.copy_(grad)
            self.manager.release([name], state=_S.READY_FOR_REDUCE, reshard=False)
            target = c
        elif self.resident:  # [Note: resident steps]
            target = self._grad_chunk(c)
            target.view(name).copy_(grad)
            self.manager.release([name], state=_S.READY_FOR_REDUCE, twin="grad")
        else:
            if c.state(name) is not _S.COMPUTE:
                self.stash(c.chunk_id)
                self.manager.access([name])
            target = self._grad_chunk(c)
            target.view(name).copy_(grad)
            self.manager.release([name], state=_S.READY_FOR_REDUCE, twin="grad")
            self.manager.release([name], state=_S.HOLD)
        self._grad_done.add(name)
        self.got_grad.add(name)
        if target.count(_S.READY_FOR_REDUCE) == len(target.records):
            self._reduce(c, target)
            return
        unused = self.manager.groups[c.chunk_id].unused
        if unused and not unused & self._used:
            rest = [n for n, r in target.records.items() if r.state is not _S.READY_FOR_REDUCE]
            if set(rest) <= unused:  # only parameters no operator reads are left: zeros
                self._fill_and_reduce(c, rest)

    def _fill_and_reduce(self, c: Chunk, rest: list[str]) -> None:
        """Count ``rest`` (tensors of chunk ``c`` with no gradient) as zeros, then reduce."""
        if self._in_place:
            self.manager.access(rest)
            for n in rest:
                c.view(n).zero_()
            self.manager.release(rest, state=_S.READY_FOR_REDUCE, reshard=False)
            self._reduce(c, c)
        else:
            g = self.manager.groups[c.chunk_id].twin("grad")
            for n in rest:
                g.view(n).zero_()
            self.manager.release(rest, state=_S.READY_FOR_REDUCE, twin="grad")
            self._reduce(c, g)

    def _open(self, c: Chunk) -> None:
        """The first gradient of chunk ``c`` in this backward arrives: an earlier micro-batch's
        reduced gradients leave the working buffer first ([Note: accumulation])."""
        group = self.manager.groups[c.chunk_id]
        if group.grads is not _G.FILLING:
            self.stash(c.chunk_id)
            group.grads = _G.FILLING

    def _grad_chunk(self, c: Chunk) -> Chunk:
        """One rank in fp32: chunk ``c``'s "grad" chunk, opened on the compute tier."""
        g = self.manager.groups[c.chunk_id].twin("grad")
        if self.manager.groups[c.chunk_id].grads is not _G.FILLING:
            self._open(c)
            # the buffer is the shard; every slot is overwritten by its gradient or zeroed in
            # _fill_and_reduce, and padding stays zero: its values (stashed above) are dead,
            # moved to the compute tier uncopied (discard) and not zeroed
            self.manager.access([g], discard=True)
        return g

    def _reduce(self, c: Chunk, target: Chunk) -> None:
        """Reduce-scatter ``target`` (``c`` itself, or one rank's "grad" chunk) into the
        chunk that keeps ``c``'s reduced gradients."""
        into = self.working(c) if target is c else None
        on_host = into is not None and self.reads_on_host(c)  # ``read_gradients_with``
        with label("Gemini::reduce_scatter"):
            self.manager.reduce(target, into=into, async_op=self._overlap, read_on_host=on_host)
        self.manager.groups[c.chunk_id].grads = _G.REDUCED
        self._update_hooks.gradients_reduced(c)

    def _reduce_partial(self) -> None:
        """End of backward: reduce every chunk that got some gradients, the rest as zeros."""
        m = self.manager
        for c in (g.param for g in m.groups.values() if not g.param.frozen):  # frozen: none
            if self._in_place:
                if c.count(_S.READY_FOR_REDUCE) == 0:
                    continue
                target = c
            elif m.groups[c.chunk_id].grads is _G.FILLING:
                target = m.groups[c.chunk_id].twin("grad")
            else:
                continue
            rest = [n for n, r in target.records.items() if r.state is not _S.READY_FOR_REDUCE]
            self._fill_and_reduce(c, rest)


def _uncount(readers: dict[str, int], names: tuple[str, ...]) -> None:
    for n in names:
        if readers.get(n, 0) > 0:
            readers[n] -= 1
