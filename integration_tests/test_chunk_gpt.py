"""colossal-chunk with the GPT of colossal-models and the MemStats of colossal-memtrace.

A GPT forward runs with its parameters in chunks under an accelerator budget of about half the
parameter bytes (the host budget small enough to spill to disk). Module hooks access each module's
parameters before it runs and release them after; the loss must equal the plain model's bit for bit,
every module must compute on the compute tier, and the budget must hold.
"""

import dataclasses

import pytest
import torch

from colossal_chunk import AutoPolicy, ChunkConfig, ChunkManager, search_chunk_size
from colossal_contracts import TensorState, TierName
from colossal_memtrace import HookTracer
from colossal_models import GPT, GPTConfig


def _model(seed=0):
    torch.manual_seed(seed)
    return GPT(dataclasses.replace(GPTConfig.preset("nano"), vocab_size=256))


@pytest.fixture(scope="module")
def traced():
    model = _model()
    tracer = HookTracer(model)
    x = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(1))
    with tracer.step():
        model(x, x).backward()
    return tracer.stats, x


def _drive(model, mgr, stats, checks):
    """Module hooks: access a module's own parameters before it runs, release them after."""
    order = [set(m) for m in stats.compute_order()]
    cursor = [0]
    handles = []
    names_of = {id(p): n for n, p in model.named_parameters()}

    def moment_of(names):
        for i in range(cursor[0], len(order)):
            if set(names) <= order[i]:
                cursor[0] = i
                return i
        return cursor[0]

    def pre(params):
        def hook(mod, args):
            names = [names_of[id(p)] for p in params]
            mgr.set_moment(moment_of(names))
            mgr.access(params)
            for n, p in zip(names, params):
                c = mgr.chunk_of(p)
                checks.append(c.tier is TierName.ACCELERATOR and c.state(n) is TensorState.COMPUTE)

        return hook

    def post(params):
        return lambda mod, args, out: mgr.release(params)

    for mod in model.modules():
        params = list(mod.parameters(recurse=False))
        if params:
            handles += [
                mod.register_forward_pre_hook(pre(params)),
                mod.register_forward_hook(post(params)),
            ]
    tied = [model.wte.weight]  # the head reuses wte outside wte's own forward
    handles += [
        model.io.register_forward_pre_hook(pre(tied)),
        model.io.register_forward_hook(post(tied)),
    ]
    return handles


def test_gpt_forward_in_chunks_under_half_the_parameter_bytes(traced):
    stats, x = traced
    model = _model()
    with torch.no_grad():
        ref = model(x, x)
    params = list(model.named_parameters())
    param_bytes = sum(p.numel() * p.element_size() for _, p in params)
    found = search_chunk_size(
        [p.numel() for _, p in params], max_bytes=param_bytes // 5, element_size=4, align=256
    )
    assert found.num_chunks >= 4
    peak_non_model = max(stats.non_model_peak(i, "accelerator") for i in range(stats.num_moments()))
    cap = param_bytes // 2 + peak_non_model
    policy = AutoPolicy(stats)
    first_use = list(dict.fromkeys(n for m in stats.compute_order() for n in m))
    cfg = ChunkConfig(
        found.chunk_numel, accelerator_bytes=cap, host_bytes=param_bytes // 3, device="cpu"
    )
    with ChunkManager(cfg, policy=policy) as mgr:
        mgr.register(params, order=first_use)
        assert policy.warm  # MemStats satisfied MemStatsSource: Belady from its compute order
        assert mgr.books.stats().tiers["disk"].used_bytes > 0  # the host budget spilled to disk
        checks = []
        handles = _drive(model, mgr, stats, checks)
        try:
            with torch.no_grad():
                for _ in range(2):
                    loss = model(x, x)
                    assert torch.equal(loss, ref)
        finally:
            for h in handles:
                h.remove()
        st = mgr.books.stats()
        assert checks and all(checks)
        assert st.tiers["accelerator"].peak_bytes <= cap
        assert st.moved("accelerator", "host").count + st.moved("accelerator", "disk").count > 0
        assert all(c.count(TensorState.COMPUTE) == 0 for c in mgr.chunks.values())
