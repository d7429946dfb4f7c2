"""Functions run on every rank of a gloo world by test_distributed.py."""

import torch
import torch.distributed as dist

from colossal_chunk import ChunkConfig, ChunkManager
from colossal_contracts import TensorState, TierName

SHAPES = [(7, 5), (13,), (3, 3, 3), (40,), (6,), (11, 2)]


def _params(seed):
    g = torch.Generator().manual_seed(seed)
    return [
        (f"p{i}", torch.nn.Parameter(torch.randn(s, generator=g))) for i, s in enumerate(SHAPES)
    ]


def gathered_chunks_equal_unsharded(seed, chunk_numel):
    params = _params(seed)  # the same on every rank
    ref = {n: p.detach().clone() for n, p in params}
    ws, rank = dist.get_world_size(), dist.get_rank()
    one_chunk = -(-chunk_numel // ws) * ws * 4
    cfg = ChunkConfig(chunk_numel, accelerator_bytes=3 * one_chunk, device="cpu")
    with ChunkManager(cfg, group=dist.group.WORLD) as mgr:
        mgr.register(params)
        shard_total = sum(c.shard_bytes for c in mgr.chunks.values())
        assert mgr.books.stats().tiers["host"].used_bytes == shard_total
        for name, p in params:
            assert p.data.numel() == 0  # sharded and not gathered: no full payload
            assert mgr.chunk_of(p).state(name) is TensorState.FREE
        for name, p in params:
            mgr.access([p])
            assert torch.equal(p.data, ref[name]), (rank, name)
            assert mgr.chunk_of(p).state(name) is TensorState.COMPUTE
            mgr.release([p])
        assert mgr.books.stats().tiers["accelerator"].peak_bytes <= 3 * one_chunk
        # every chunk's shard is this rank's slice of the flat chunk
        for c in mgr.registry.param_chunks():
            full = torch.zeros(c.capacity)
            for r in c:
                full[r.offset : r.end] = ref[r.name].reshape(-1)
            s = c.shard_numel
            assert torch.equal(c.shard.cpu(), full[rank * s : (rank + 1) * s])
            mgr.move(c, TierName.DISK)
        for name, p in params:  # gather from shards on disk
            mgr.access([p])
            assert torch.equal(p.data, ref[name])
            mgr.release([p])
        return len(mgr.registry.param_chunks())


def reduce_scattered_grads_equal_all_reduced_slices(seed, chunk_numel):
    params = _params(seed)
    ref = {n: p.detach().clone() for n, p in params}
    ws, rank = dist.get_world_size(), dist.get_rank()
    cfg = ChunkConfig(chunk_numel, device="cpu")
    with ChunkManager(cfg, group=dist.group.WORLD) as mgr:
        mgr.register(params)
        masters = mgr.add_parallel("master", torch.float64, copy_params=True)
        grads = mgr.add_parallel("grad", torch.float32)
        g = torch.Generator().manual_seed(1000 + rank)
        for pc, gc, mc in zip(mgr.registry.param_chunks(), grads, masters):
            mgr.access([gc], zero=True)  # a zero full buffer, no communication
            mine = torch.zeros(gc.capacity)
            for r in gc:
                val = torch.randint(-50, 50, r.shape, generator=g).float()  # exact sums
                gc.view(r.name).copy_(val)
                mine[r.offset : r.end] = val.reshape(-1)
            mgr.release([gc], state=TensorState.READY_FOR_REDUCE)
            mgr.reduce(gc)
            dist.all_reduce(mine)
            mine /= ws
            s = gc.shard_numel
            assert torch.equal(gc.shard.cpu(), mine[rank * s : (rank + 1) * s]), rank
            assert all(r.state is TensorState.FREE for r in gc)
            assert not gc.is_gathered
            # the fp64 master shard holds this rank's slice of the parameters
            for r in mc:
                part = mc.shard_view(r.name)
                if part is not None:
                    view, a, b = part
                    expect = ref[r.name].reshape(-1)[a:b].double()
                    assert torch.equal(view, expect)
            del pc
        acc = mgr.books.stats().tiers["accelerator"]
        assert acc.used_bytes == sum(
            c.shard_bytes for c in mgr.chunks.values() if c.tier is TierName.ACCELERATOR
        )
        return True


def random_accesses_under_budget(seed, n_accesses):
    """The same random access sequence on every rank (collectives stay in step): sharded chunks
    gather correctly under a budget of ~two gathered chunks, evicting shards to host and disk."""
    import random

    rng = random.Random(seed)  # same on every rank
    params = _params(seed)
    ref = {n: p.detach().clone() for n, p in params}
    ws = dist.get_world_size()
    chunk_numel = 48
    full = -(-chunk_numel // ws) * ws * 4
    cap = full + 2 * full // ws  # one gathered chunk and two shards
    cfg = ChunkConfig(chunk_numel, accelerator_bytes=cap, host_bytes=full // ws, device="cpu")
    with ChunkManager(cfg, group=dist.group.WORLD) as mgr:
        mgr.register(params)
        for _ in range(n_accesses):
            name, p = params[rng.randrange(len(params))]
            mgr.access([p])
            assert torch.equal(p.data, ref[name])
            if rng.random() < 0.5:
                p.data.add_(1.0)  # every rank writes the same update
                ref[name] = ref[name] + 1.0
            mgr.release([p])
            for t in mgr.books.stats().tiers.values():
                assert t.peak_bytes <= t.capacity_bytes
        moved = mgr.books.stats()
        for name, p in params:
            mgr.access([p])
            assert torch.equal(p.data, ref[name])
            mgr.release([p])
        return moved.moved("accelerator", "disk").count + moved.moved("accelerator", "host").count


def views_leave_a_buffer_before_its_bytes_leave_the_books(seed, chunk_numel):
    """[Note: books follow storage]: at every operator a release runs, the gathered buffers the
    parameters' views still hold are within the compute tier's books (a memory tracer measures
    non-model bytes as live bytes minus the books: a buffer out of the books but still viewed
    read as an activation of a whole chunk)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    params = _params(seed)
    cfg = ChunkConfig(chunk_numel, device="cpu")
    with ChunkManager(cfg, group=dist.group.WORLD) as mgr:
        mgr.register(params)
        acc = mgr.books.tiers[TierName.ACCELERATOR]
        over: list[int] = []

        class _Check(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                held = {}
                for _, p in params:
                    s = p.data.untyped_storage()
                    if s.nbytes():
                        held[s.data_ptr()] = s.nbytes()
                over.append(sum(held.values()) - acc.used_bytes)
                return func(*args, **(kwargs or {}))

        released = 0
        for _, p in params:
            mgr.access([p])
            with _Check():
                mgr.release([p])
            released += mgr.chunk_of(p).full is None
        assert released > 0 and over, (released, len(over))
        return max(over)
