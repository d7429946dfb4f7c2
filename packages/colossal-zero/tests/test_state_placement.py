"""Adam states on the accelerator where the per-moment plan shows room ([Note: state placement]):
which chunks' states land on which tier, and that placing them changes no arithmetic (weights
bit-identical to keeping every state on the host; fp32 equal to plain AdamW within 1e-5)."""

from __future__ import annotations

import _checks_zero as checks
import pytest
import torch
from _zero_model import reference

from colossal_contracts import ConfigError, TierName
from colossal_zero import GeminiConfig

STEPS, BATCH = 6, 8
ACC, HOST = TierName.ACCELERATOR, TierName.HOST


def run(cfg: GeminiConfig):  # type: ignore[no-untyped-def]
    model, opt = checks.make(cfg)
    stats: list = []
    losses = checks.train(model, opt, STEPS, BATCH, stats=stats)
    moved = [s.bytes_moved for s in stats]
    moved = [b - a for a, b in zip([0, *moved], moved, strict=False)]
    return model, opt, losses, moved


def tiers(model, kind: str) -> list[TierName]:  # type: ignore[no-untyped-def]
    m = model.runtime.manager
    return [m.registry.parallel_chunk(kind, c).tier for c in m.registry.param_chunks()]


def assert_same_weights(a, b) -> None:  # type: ignore[no-untyped-def]
    wa, wb = a.full_state_dict(), b.full_state_dict()
    assert wa.keys() == wb.keys()
    diff = [k for k in wa if not torch.equal(wa[k], wb[k])]
    assert not diff, f"weights differ bit-wise: {diff[:4]}"


def test_without_a_budget_every_state_moves_to_the_accelerator_and_steady_steps_move_nothing():
    base = dict(precision="fp32", chunk_numel=8192)
    free, opt, losses, moved = run(GeminiConfig(**base))
    host, _, host_losses, host_moved = run(GeminiConfig(**base, states_placement="host"))
    assert set(tiers(free, "exp_avg")) == {ACC} and set(tiers(free, "exp_avg_sq")) == {ACC}
    assert opt.state_plan.chunks and opt.state_plan.state_bytes > 0
    assert set(tiers(host, "exp_avg")) == {HOST}
    # host states: every step stages parameters and gradients through the host (counted)
    assert moved[-1] == 0 and all(b > 0 for b in host_moved), (moved, host_moved)
    assert losses == host_losses
    assert_same_weights(free, host)
    ref_losses, ref_weights = reference(STEPS, BATCH)
    for g, w in zip(losses, ref_losses, strict=True):
        assert abs(g - w) <= 1e-5 * abs(w)
    got = free.full_state_dict()
    assert max(float((got[k] - v).norm() / v.norm()) for k, v in ref_weights.items()) <= 1e-5


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_under_a_budget_demand_splits_states_and_free_displaces_no_chunk(precision):
    budget = 240_000 if precision == "fp32" else 160_000
    base = dict(precision=precision, accelerator_bytes=budget, chunk_numel=8192)
    demand, opt, losses, _ = run(GeminiConfig(**base, states_placement="demand"))
    _, free_opt, free_losses, free_moved = run(GeminiConfig(**base))
    host, _, host_losses, host_moved = run(GeminiConfig(**base, states_placement="host"))
    placed = set(opt.state_plan.chunks)
    m = demand.runtime.manager
    ids = [c.chunk_id for c in m.registry.param_chunks()]
    assert placed and placed != set(ids), "the budget should take some chunks' states, not all"
    kinds = ("exp_avg", "exp_avg_sq", "master") if precision == "bf16" else ("exp_avg",)
    for kind in kinds:  # masters live with their chunk's states
        assert tiers(demand, kind) == [ACC if i in placed else HOST for i in ids], kind
    assert m.books.stats().tiers["accelerator"].peak_bytes <= budget
    # the budget is full of cached chunks at some moment: "free" places nothing, moves the same
    assert free_opt.state_plan.chunks == () and free_moved == host_moved
    assert losses == host_losses == free_losses
    assert_same_weights(demand, host)


def test_states_that_fit_on_no_host_start_on_the_accelerator_and_stay_there():
    base = dict(precision="fp32", chunk_numel=8192)
    whole, _, losses, _ = run(GeminiConfig(**base, states_placement="host"))
    m = whole.runtime.manager
    params_and_grads = sum(c.shard_bytes for c in m.chunks.values() if c.kind in ("param", "grad"))
    one_state = sum(
        m.registry.parallel_chunk("exp_avg", c).shard_bytes for c in m.registry.param_chunks()
    )
    # room on the host for parameters, gradients and half of one Adam moment
    cfg = GeminiConfig(**base, host_bytes=params_and_grads + one_state // 2)
    spilled, _, spilled_losses, _ = run(cfg)
    avg, sq = tiers(spilled, "exp_avg"), tiers(spilled, "exp_avg_sq")
    assert HOST in avg and ACC in sq, (avg, sq)
    assert spilled_losses == losses
    assert_same_weights(spilled, whole)


def test_unknown_states_placement_is_a_config_error():
    with pytest.raises(ConfigError, match="states_placement"):
        GeminiConfig(states_placement="gpu")
