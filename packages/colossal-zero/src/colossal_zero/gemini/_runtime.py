"""Gemini's runtime: brings chunks to the compute tier around every operator that reads a
parameter, collects gradients into chunk memory and reduce-scatters them.

[Note: operator hooks] While the wrapped module runs forward, a ``TorchFunctionMode`` sees every
torch call. A call that reads registered parameters is one *moment*: the parameters are accessed
(COMPUTE, on the compute tier, gathered) before it and released to HOLD after it, and its tensor
outputs pass through ``_PreBackward``, whose backward accesses the same parameters again before
the operator's backward runs. Catching operators rather than modules also covers parameters used
outside their module (a tied output head). Gradients go into chunk memory as they arrive
([Note: gradients in chunks] in ``_collect.py``).

[Note: released after backward] A trainable parameter's gradient hook releases it (its
gradient is in chunk memory). A parameter read by more than one operator in a forward (a tied
output head) gets its gradient only after the backward of its first reader, so its chunk would
stay in COMPUTE, pinned on the compute tier, from the backward of its last reader to the end of
backward, beside the chunks every operator in between needs (GPT's tied embedding: three chunks
in use at once). So the later readers release it after their backward, as frozen parameters are
released after every reader's: without resharding (a chunk nothing needs to evict keeps its
gathered buffer, and the next reader finds it there), but movable, so that room can be made.
The first reader's backward accesses it again, and its gradient hook collects the sum.

[Note: accumulation] Reduced gradients wait in the working buffer until the optimizer step. If
the chunk is needed again first (the next micro-batch), they are added into a lazily created
fp32 "acc" chunk and, with masters, the parameters are restored from the masters.

[Note: resident steps] When a step begins after warmup (not measured, one rank) and the manager
says the step can run without touching a tier (colossal-chunk's [Note: resident fast path]), the
step is *resident*: operators neither access nor release their parameters (they stay HOLD, in
place), their outputs get no ``_PreBackward`` and their saved tensors no places ([Note: saved
parameter views]: the storage cannot move), and gradients are written into chunk memory as in
the general path, without re-accessing the parameter in fp32; on one rank without masters, when
the manager shows room for them, they are not copied at all ([Note: kept gradients] in
``_grads.py``). Stashing for accumulation, the reductions and every value are those of the
general path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from colossal_chunk import Chunk, ChunkManager, GradPhase
from colossal_contracts import PlacementPolicy, StepRecorder, TensorState

from .._lazy import LazyInit
from ._chunk_index import ChunkIndex
from ._collect import GradientCollection
from ._comm import CommSchedule, GeminiHooks, RankMaxStats
from ._config import GeminiConfig
from ._fit import fit_chunk_size
from ._grads import AfterStep
from ._hooks import AccessMode, label
from ._place import place_module
from ._state import TrainingState
from ._warmup import OrderDigest, WarmupTrace, agree

__all__ = ["GeminiRuntime"]

_S = TensorState
_T = TrainingState
_G = GradPhase
_OPS = ("all-gather", "reduce-scatter")


class GeminiRuntime(GradientCollection):
    """The state behind one Gemini-managed module; see the notes of this module."""

    manager: ChunkManager
    policy: PlacementPolicy  # the manager's, built with it: fed what the warmup measured
    world_size: int  # ranks in ``group`` (1 without one)
    moment: int  # the moment the manager was last told (set_moment)
    names: dict[int, str]  # id(param) -> registered name
    params: dict[str, nn.Parameter]  # registered name -> parameter
    aliases: dict[str, str]  # every name in module.named_parameters(remove_duplicate=False)

    def __init__(
        self,
        module: nn.Module,
        config: GeminiConfig,
        group: dist.ProcessGroup | None,
        recorder: StepRecorder | None = None,
        lazy: LazyInit | None = None,
    ):
        self.config, self.precision, self.group = config, config.precision_spec, group
        self.world_size = dist.get_world_size(group) if group is not None else 1
        named = list(module.named_parameters())
        ids = {id(p): n for n, p in named}
        self.aliases = {n: ids[id(p)] for n, p in module.named_parameters(remove_duplicate=False)}
        self.params = dict(named)
        self.names = {id(p): n for n, p in named}
        self.agreeing = False  # [Note: rank agreement]: the warmup checks each collective
        self.comm: CommSchedule | None = None  # [Note: overlap]: the schedule, after warmup
        hooks = GeminiHooks(self)
        self.manager, self.policy = place_module(module, named, config, group, hooks, lazy)
        dtype = self.precision.param_dtype
        for n, p in named:
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._grad_hook(n))
        self.mode = AccessMode(self)
        self._moment = self.moment = 0  # the next moment of this step; the one last set
        self._warmup = WarmupTrace(recorder, config.non_model_bytes)
        self._digest = OrderDigest()
        self._recording = True
        self._repack: dict[str, int] | None = None  # a re-pack due, with the sizes fitted
        self._never_read: set[str] = set()  # names that got no gradient in the warmup step
        self._probe: StepRecorder | None = None  # measures one later step (measure_next_step)
        self._probing: bool | None = False  # None: armed by measure_next_step
        self.measured: Any = None  # what the probe measured (a MemStatsSource)
        self.state = _T.IDLE  # [Note: training state]
        one_fp32 = not self.precision.master and self.world_size == 1
        self._read_only_kinds = ("param",) if one_fp32 else ()  # see _to
        self._grad_done: set[str] = set()  # names whose gradient this backward collected
        self.got_grad: set[str] = set()  # names with a gradient since the last step/zero_grad
        self._used: set[str] = set()  # names an operator read since the forward began
        # [Note: overlap]: collectives ahead of use and without waiting, once the order is known
        self._overlap = config.overlap_comm and self.world_size > 1
        self.resident = False  # [Note: resident steps]: decided as each forward begins
        self.keeping = False  # [Note: kept gradients] in _grads.py: decided with resident
        self._readers, self._parts, self._live = {}, set(), {}  # [Note: gradients in parts]
        self.forwards = 0  # forwards begun: are gradients still the last step's?
        self.after_step = AfterStep()  # dropped as each forward begins
        self._read_with = None  # see read_gradients_with
        self._kept_bytes = sum(  # what kept gradients hold at most: one per trainable parameter
            p.numel() * dtype.itemsize for p in self.params.values() if p.requires_grad
        )
        self._index_chunks()

    # ----- forward ------------------------------------------------------------------------------
    def params_in(self, args: Sequence[Any], kwargs: dict[str, Any]) -> tuple[str, ...]:
        """Registered parameters among ``args`` and ``kwargs`` (and lists or tuples in them). By
        identity: a live object whose id is a parameter's is that parameter."""
        names, found = self.names, None
        for a in (*args, *kwargs.values()) if kwargs else args:
            n = names.get(id(a))
            if n is not None:
                found = found or {}
                found[n] = None
            elif type(a) is list or type(a) is tuple:
                for b in a:
                    n = names.get(id(b))
                    if n is not None:
                        found = found or {}
                        found[n] = None
        return tuple(found) if found else ()

    def _to(self, new: TrainingState) -> None:
        self.state = self.state.to(new)
        # [Note: disk copies] in colossal-chunk: within a forward or a backward nothing writes
        # fp32 parameter shards on one rank (gradients go to their own chunks)
        reads_only = new is _T.FORWARD or new is _T.BACKWARD
        self.manager.shard_io.keep_disk_copies(self._read_only_kinds if reads_only else ())

    def begin_forward(self) -> None:
        if self.state is _T.BACKWARD:  # the previous backward raised: forget its partial state
            self._grad_done.clear()
            self._finish_kept()
            self._drop_parts()
        self._to(_T.FORWARD)
        self.forwards += 1
        self._moment = 0
        self._used.clear()
        self._digest.reset()
        books = self.manager.books
        if self._recording:
            self._warmup.start(books.model_data_bytes, books.model_tensors())
            if self.group is not None:
                self.agreeing = True
            return
        self._warmup.close()  # outside backward: removes what the warmup installed
        if self._probe is not None:
            self._probe.close()
            self._probing = self._probing is None  # None: armed by measure_next_step
            if self._probing:
                self._probe.start(books.model_data_bytes, books.model_tensors())
            else:
                self._probe = None
        busy = any(g.holds_gradients for g in self.manager.groups.values())
        repacked = self._repack is not None and not busy
        if repacked:
            sizes, self._repack = self._repack, None
            self.manager.repack(self._warmup.first_use(), **(sizes or {}))
            self._index_chunks()
        m = self.manager
        resident = not self._probing and self.comm is None
        headroom = self._lazy_headroom()
        self.keeping = (  # room for autograd's gradients beside the chunks: keep them
            resident
            and self.world_size == 1
            and not self.precision.master
            and m.residency.fully_resident(headroom + self._kept_bytes)
        )
        self.resident = self.keeping or (resident and m.residency.fully_resident(headroom))
        # steady: a resident step with no chunk replaced moves no shard before the next step
        self.after_step.forward_begins(self.resident and not repacked)

    def _lazy_headroom(self) -> int:
        """Compute-tier bytes the step may add: the fp32 "acc" chunks, until they exist."""
        groups = self.manager.groups.values()
        if any("acc" in g.twins for g in groups):  # (every trainable chunk has one then)
            return 0
        return sum(g.param.capacity * 4 for g in groups if not g.param.frozen)

    def resident_op(self, names: tuple[str, ...]) -> None:
        """``pre_op`` of a resident step ([Note: resident steps]): no access, no moment."""
        self._used.update(names)
        if self.group is not None:
            self._digest.add(names)
        for cid in self.index.chunk_ids(names):
            if self.manager.groups[cid].grads is _G.REDUCED:
                self.stash(cid)

    def pre_op(self, names: tuple[str, ...]) -> None:
        self._used.update(names)
        self._advance(names)
        for cid in self.index.chunk_ids(names):
            self.stash(cid)
        self._access(names)
        self._gather_next()

    def post_op(self, names: tuple[str, ...]) -> None:
        busy = [n for n in names if self.index.chunk(n).state(n) is _S.COMPUTE]
        if busy:
            self.manager.release(busy, state=_S.HOLD)

    def _access(self, names: Sequence[str]) -> None:
        self.manager.access(names)  # the manager's fast path covers resident chunks

    def _advance(self, names: tuple[str, ...]) -> None:
        """A moment begins ([Note: moments] in colossal-contracts): moments count from 0."""
        moment = self._moment
        self._moment += 1
        self._digest.add(names)
        if self._probing and self._probe is not None:
            self._probe.cut(names)
        self.moment = moment
        if self._recording:
            self._warmup.moment(names)
            self.manager.set_moment(moment)
        else:
            self.manager.set_moment(moment, prefetch=self.config.prefetch)

    def _gather_next(self) -> None:
        """[Note: overlap], [Note: gathers several ahead]: start the coming moments' all-gathers
        once this moment's chunks are accessed (their room comes first). Sharded gradients need
        no room of their own in backward ([Note: gradients in chunks] in ``_collect.py``)."""
        if self.comm is None or self._recording:
            return
        with label("Gemini::gather_ahead"):
            groups, backward = self.manager.groups, self.state is _T.BACKWARD

            def started(cid: int) -> bool:  # or, in backward, reduced in it: not needed again
                rec = groups[cid]
                return rec.param.is_gathered or (backward and rec.grads is _G.REDUCED)

            ahead = self.comm.ahead(self._moment - 1, started)
            if not ahead:
                return
            for cid in ahead:  # [Note: accumulation] before the shard is gathered
                self.stash(cid)
            self.manager.gather_ahead(ahead)

    def agree_collective(self, op: str, chunk: Chunk) -> None:
        """See [Note: rank agreement]: before each collective of the warmup step."""

        def describe(key: list[int]) -> str:
            op_name, cid = _OPS[key[0]], key[1]
            rec = self.manager.groups.get(cid)
            names = list(rec.param.records) if rec is not None else []
            return f"{op_name} of chunk {cid} (parameters {names[:3]}{'...' if len(names) > 3 else ''})"

        if self.group is not None:  # (installed only with a group)
            agree(self.group, "a chunk collective", [_OPS.index(op), chunk.chunk_id], describe)

    # ----- backward -----------------------------------------------------------------------------
    def end_forward(self) -> None:
        """The wrapped module's forward returned."""
        self._to(_T.PRE_BACKWARD)

    def _start_backward(self) -> None:
        if self.state is not _T.BACKWARD:
            self._to(_T.BACKWARD)
            if self._recording:
                self._warmup.mark_backward()
            torch.autograd.Variable._execution_engine.queue_callback(self._finish_backward)

    def pre_backward(self, names: tuple[str, ...]) -> None:
        self._start_backward()
        self._advance(names)
        todo = [n for n in names if n not in self._grad_done]
        for cid in {self.index.ids[n] for n in todo}:
            if self.manager.groups[cid].grads is not _G.FILLING:
                self.stash(cid)
        if todo:
            self._access(todo)
        self._gather_next()

    def released_after_backward(self, names: tuple[str, ...]) -> tuple[str, ...]:
        """Of the parameters an operator of the forward reads, those its backward releases:
        frozen ones, and trainable ones an earlier operator of this forward read ([Note:
        released after backward]). Call before ``pre_op``."""
        # a recomputation in backward reads again what its forward read: no reader is later
        read = self._used if self.state is _T.FORWARD else ()
        return tuple(n for n in names if n in read or not self.params[n].requires_grad)

    def post_backward(self, names: tuple[str, ...]) -> None:
        """After an operator's backward: the parameters it read that no gradient hook releases
        now go back to HOLD ([Note: released after backward]); trainable ones keep their chunk
        gathered."""
        m = self.manager
        busy = [n for n in names if self.index.chunk(n).state(n) is _S.COMPUTE]
        frozen = [n for n in busy if not self.params[n].requires_grad]
        if frozen:
            m.release(frozen, state=_S.HOLD)
        shared = [n for n in busy if self.params[n].requires_grad]
        if shared:
            m.release(shared, state=_S.HOLD, reshard=False)

    def _finish_backward(self) -> None:
        with label("Gemini::finish_backward"):
            self._end_backward()

    def _end_backward(self) -> None:
        """End of backward: release what is still in COMPUTE, reduce partly filled chunks,
        finish every collective in flight."""
        self._to(_T.POST_BACKWARD)
        self._collect_parts()  # [Note: gradients in parts] in _collect.py
        m = self.manager
        for c in (g.param for g in m.groups.values()):
            if c.pinned:
                m.release([n for n, r in c.records.items() if r.state is _S.COMPUTE])
        self._finish_kept()
        self._reduce_partial()
        self._settle_then_update()  # no copy in flight: the optimizer writes shards next
        self._grad_done.clear()
        self._to(_T.IDLE)
        if self._recording:
            self._recording = False
            self.agreeing = False
            stats = self._warmup.finish()
            if self.group is not None and self.world_size > 1 and self._warmup.order:
                stats = RankMaxStats(stats, self.group)  # the same room on every rank
            if self._overlap and self._warmup.order:
                self.comm = CommSchedule(self._warmup.order, self.index, self.config.gather_ahead)
            self._never_read = {n for n in self.params if n not in self.got_grad}
            self._index_chunks()
            if self._warmup.order:
                self.policy.update(stats)
            first = self._warmup.first_use()
            done = set(first)
            layout = list(self.index.ids)  # parameter names in the order they sit in chunks
            packing = first + [n for n in layout if n not in done]  # [Note: first-use order]
            self._repack = {} if packing != layout else None
            reserve = getattr(self.policy, "non_model_reserve", None)
            if reserve is not None and self._warmup.order:  # [Note: feasibility rule] in _fit.py
                w, grad_twin = self._warmup, not self.precision.master  # [Note: chunk roles]
                bwd = len(w.order) if w.backward_from is None else w.backward_from
                self._repack = fit_chunk_size(m, reserve, w.order, bwd, packing, self.world_size,
                    grad_twin, peak=getattr(self.policy, "non_model_peak", None)) or self._repack  # fmt: skip
        else:
            if self._probing and self._probe is not None:
                self.measured = self._probe.finish()
                self._probing = False
            if self.group is not None:  # [Note: rank agreement]: one digest per step
                agree(self.group, "the end of backward", [self._digest.value], _digest_words)

    def close_recorders(self) -> None:
        """Remove what the warmup's and a probe's recorders installed (their dispatch modes).
        Call outside backward, on the thread that runs the steps: after a backward that raised
        (a refusal at the end of the warmup: no next forward will close them) or at the end."""
        self._warmup.close()
        if self._probe is not None:
            self._probe.close()

    def measure_next_step(self, recorder: StepRecorder) -> None:
        """Measure the next step (after warmup) with ``recorder`` without changing the plan; the
        result lands in ``measured`` at the end of that step's backward."""
        self._probe, self._probing = recorder, None

    def _index_chunks(self) -> None:
        """The runtime's ``ChunkIndex`` ([Note: chunk index] in ``_chunk_index.py``), and on each
        chunk's record (the manager's ``ChunkGroup``) the trainable parameters warmup never read."""
        groups = self.manager.groups
        self.index = ChunkIndex(groups)
        for g in groups.values():
            unused = frozenset(n for n in g.param.records if n in self._never_read)
            g.unused = unused if all(self.params[n].requires_grad for n in unused) else frozenset()
        if self.comm is not None:
            self.comm.reindex(self.index)


def _digest_words(key: list[int]) -> str:
    return f"access-order digest {key[0]:#x}"
