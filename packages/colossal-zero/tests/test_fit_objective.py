"""Issue 35 item 5: on several ranks the post-warmup fit takes, among the chunk sizes that keep the
feasibility rule, the one whose step costs least in collectives and moved bytes ([Note: fit
objective]), not the first halving that keeps it; training stays exact."""

from __future__ import annotations

import _checks_zero as checks
import pytest
import torch
from _zero_model import reference
from test_gemini import BATCH, STEPS, assert_losses_close, rel_err

from colossal_zero import GeminiConfig
from colossal_zero.gemini._fit import _ladder, _layout, _tight
from colossal_zero.gemini._fit_cost import COLLECTIVE_HOP_BYTES, step_cost

# 16384-element fp32 chunks break the rule at 280 kB on 2 ranks (20 kB reserve); halving took
# 8192 (7 chunks: 14 all-gathers and 7 reduce-scatters a step), while 12288 keeps the rule too
CFG = GeminiConfig(
    precision="fp32", accelerator_bytes=280_000, chunk_numel=16384, non_model_bytes=20_000
)
HALVING_COLLECTIVES = 21


def test_the_ladder_steps_between_halvings_and_ends_where_halving_ends():
    assert _ladder((16384, 16384), (4096, 4096), 2, halving_only=True) == [
        (8192, 8192),
        (4096, 4096),
    ]
    sizes = [n for n, _ in _ladder((16384, 16384), (4096, 4096), 2)]
    assert sizes == [14336, 12288, 10240, 8192, 6144, 4096]
    # each kind stops at its own largest tensor (rounded up to a multiple of the world size)
    assert _ladder((16384, 8192), (5000, 8192), 2)[-1] == (5000, 8192)


def test_a_tight_size_packs_every_tensor_as_the_size_it_tightens():
    """[Note: tight sizes]: three 3000-element fp32 tensors in 8192-element chunks on 2 ranks go
    two and one; 6144 (6000 rounded up to 2048) packs them so, 4096 would not."""
    fp32 = torch.float32
    tensors = {"a": (3000, fp32, False), "b": (3000, fp32, False), "c": (3000, fp32, False)}
    tensors |= {"f": (5000, fp32, True)}  # a frozen kind tightens on its own
    names = list(tensors)
    assert _tight(names, tensors, (8192, 8192), 2) == (6144, 6144)
    assert _layout(names, tensors, (6144, 6144)) == _layout(names, tensors, (8192, 8192))
    assert _layout(names, tensors, (4096, 6144)) != _layout(names, tensors, (8192, 8192))
    # a kind without tensors keeps its size
    del tensors["f"]
    assert _tight(names[:3], tensors, (8192, 16384), 2) == (6144, 16384)


def test_step_cost_counts_gathers_per_run_reduce_scatters_and_belady_moves():
    # two 1000-byte chunks on 2 ranks (500-byte shards): a forward reads 0, 0, 1; a backward 1, 0
    order = [("a",), ("a",), ("b",), ("b",), ("a",)]
    chunk_of, whole = {"a": 0, "b": 1}, {0: 1000, 1: 1000}
    roomy = step_cost(order, 3, chunk_of, whole, [10_000] * 5, ws=2, grad_twin=True)
    # all-gathers: a (moments 0-1), b (2-3), a (4); reduce-scatters: 2
    assert roomy.collectives == 5
    # everything goes home for the update: shards of a and b in (1000), out with both twins (2000)
    assert roomy.moved == 3000
    # unoverlapped: this rank's half of a's first all-gather and of a's last reduce-scatter
    assert roomy.exposed == 1000
    assert roomy.cost == 5 * COLLECTIVE_HOP_BYTES + 3000 + 1000
    # room for one moment's chunk and buffer only: a is evicted for b and loaded again
    tight = step_cost(order, 3, chunk_of, whole, [1500] * 5, ws=2, grad_twin=True)
    assert tight.collectives == 5
    assert tight.moved > roomy.moved
    with pytest.raises(ValueError, match="several ranks"):
        step_cost(order, 3, chunk_of, whole, [10_000] * 5, ws=1, grad_twin=True)


def _fit_and_count(config: GeminiConfig) -> tuple[list[float], dict, int, int, int]:
    """Losses, weights, chunk size, chunks and collectives of the step after the warmup."""
    model, opt = checks.make(config)
    losses = checks.train(model, opt, 2, BATCH)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        losses += checks.train(model, opt, 1, BATCH, start=2)
    coll = sum(
        e.count
        for e in prof.key_averages()
        if e.key in ("c10d::_allgather_base_", "c10d::_reduce_scatter_base_")
    )
    losses += checks.train(model, opt, STEPS - 3, BATCH, start=3)
    m = model.runtime.manager
    return losses, model.full_state_dict(), m.registry.chunk_numel, len(m.groups), coll


def test_the_fit_takes_fewer_collectives_than_halving_and_trains_exactly(world):
    out = world(2).run(_fit_and_count, CFG)
    ref_losses, ref_weights = reference(STEPS, BATCH)
    for losses, weights, numel, chunks, coll in out:
        assert numel not in (16384, 8192)  # a size between the halvings
        assert chunks < 7
        assert coll < HALVING_COLLECTIVES
        assert_losses_close(losses, ref_losses, 1e-5)
        assert rel_err(weights, ref_weights) <= 1e-5


def _fit_and_pack(config: GeminiConfig) -> tuple[int, int, int]:
    """The chunk size the fit took, its fullest chunk's elements, and the world size."""
    import torch.distributed as dist

    model, opt = checks.make(config)
    checks.train(model, opt, 3, BATCH)
    m = model.runtime.manager
    fullest = max(sum(r.numel for r in g.param.records.values()) for g in m.groups.values())
    return m.registry.chunk_numel, fullest, dist.get_world_size()


def test_the_fit_takes_the_tightest_size_that_packs_the_same(world):
    """[Note: tight sizes]: no smaller size (a multiple of 1024 x ws) holds the fullest chunk."""
    for numel, fullest, ws in world(2).run(_fit_and_pack, CFG):
        assert numel < 16384  # the fit re-packed
        assert numel - 1024 * ws < fullest <= numel
