"""The planner's Gemini tiers ([Note: gemini tiers] in ``plan/_gemini_tiers``): the split of a
rank's chunks over accelerator, host and disk, worked by hand from the runtime's rules, and
against what a one-rank ``gemini-disk`` run under the job's budgets puts on each tier."""

from __future__ import annotations

import pytest
import torch
from _gemini_peaks import step_peaks

from colossal.plan import Layout, device_memory, from_gpt_config
from colossal.plan._gemini import GeminiBytes, gemini_bytes, tier_budget
from colossal.plan._gemini_tiers import disk_host_budget, gemini_tiers, registration_order
from colossal_memtrace import LiveTensorTracker
from colossal_models import GPT, GPTConfig
from colossal_zero import GeminiConfig, GeminiOptimizer, apply_gemini

SHARD = 4096  # bytes: one rank's fp32 shard of a 4096-element chunk over 4 ranks


def _two_chunks() -> GeminiBytes:
    """GPT-free numbers: two fp32 chunks of 4096 elements over 4 ranks, 1024 per shard."""
    return GeminiBytes(
        chunk_numel=4096,
        num_chunks=2,
        frozen_chunks=0,
        frozen_chunk_numel=0,
        params=2 * SHARD,
        grads=2 * SHARD,
        optimizer=4 * SHARD,
        gathered=2 * 4 * SHARD,  # two whole chunks in flight (fewer than three chunks)
        spare=SHARD,
        frozen=0.0,
        in_flight=2 * SHARD,
    )


def test_registration_order_is_params_twins_then_adams_moments():
    kinds = [k for k, _ in registration_order(_two_chunks(), 4, "fp32")]
    assert kinds == ["param"] * 2 + ["grad"] * 2 + ["exp_avg"] * 2 + ["exp_avg_sq"] * 2
    bf16 = registration_order(_two_chunks(), 4, "bf16")
    assert bf16[0] == ("param", SHARD / 2) and bf16[2] == ("master", SHARD)


@pytest.mark.parametrize(
    "budget, window",
    [
        (8 * SHARD, 2 * SHARD),  # W = min(4 shards, H // 4 in whole shards) = 2 shards
        (7 * SHARD, 1 * SHARD),  # H // 4 = 1.75 shards: one
    ],
)
def test_split_worked_by_hand(budget, window):
    t = gemini_tiers(_two_chunks(), 4, "fp32", host_budget=budget)
    # payloads fit in H - W: parameters (2), gradients (2), exp_avg (2) fill 6 shards in both
    # cases; exp_avg_sq (2) goes to disk, whose pages read ahead (at most W) are host memory
    assert t.disk == 2 * SHARD
    assert t.read_ahead == window
    # the two chunks in flight: gathered buffers and their parameter shards, off the host
    assert t.device == 2 * 4 * SHARD + 2 * SHARD
    assert t.host == 6 * SHARD - 2 * SHARD + window + SHARD  # payloads - in flight + W + spare
    assert t.host_budget == budget


def test_no_host_budget_keeps_everything_on_the_host():
    t = gemini_tiers(_two_chunks(), 4, "fp32", host_budget=None)  # gemini-host-all
    assert (t.disk, t.read_ahead) == (0.0, 0.0)
    assert t.host == 8 * SHARD - 2 * SHARD + SHARD


def test_host_budget_floor_holds_parameters_and_gradients_beside_the_window():
    gem = _two_chunks()
    # need 4 shards; W(4 shards) = 1 shard, W(5 shards) = 1 shard: the floor is 5 shards
    assert disk_host_budget(gem, 4, host_memory=0) == 5 * SHARD
    assert disk_host_budget(gem, 4, host_memory=6 * SHARD) == 6 * SHARD
    assert disk_host_budget(gem, 4, host_memory=None) == tier_budget(4 * SHARD)


CFG = GPTConfig(vocab_size=256, max_seq_len=128, num_layers=2, num_heads=4, hidden_size=64)
LAYOUT = Layout(1, 1, 1, "1d", 1, "gemini-disk", 2, 1, "none")


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_one_rank_run_puts_on_each_tier_what_the_plan_says(precision, tmp_path):
    shape = from_gpt_config(CFG, "t")
    gem0 = gemini_bytes(shape, LAYOUT, precision, 0.0)
    # host memory for four fp32 shards: a window of one, and Adam's exp_avg_sq spills to disk
    host_memory = 4 * gem0.chunk_numel * 4
    mem = device_memory(
        shape, LAYOUT, CFG.max_seq_len, precision=precision, host_memory=host_memory
    )
    gem = gemini_bytes(shape, LAYOUT, precision, mem.activations)
    assert mem.disk > 0 and mem.read_ahead > 0
    cfg = GeminiConfig(  # what `colossal train --layout` gives the runtime ([Note: layout flags])
        precision=precision,
        accelerator_bytes=tier_budget(mem.device_total),
        non_model_bytes=int(mem.activations),
        host_bytes=int(mem.host_budget),
        disk_bytes=tier_budget(mem.disk),
        disk_dir=tmp_path,
        states_placement="host",
    )
    tracker = LiveTensorTracker("cpu")
    with tracker:
        torch.manual_seed(0)
        model = apply_gemini(GPT(CFG), cfg)
        opt = GeminiOptimizer(model, lr=1e-3)
        x, y = torch.randint(0, CFG.vocab_size, (2, 2, CFG.max_seq_len))
        peaks = step_peaks(tracker, model, opt, x, y)
        tiers = model.runtime.manager.books.stats().tiers
        model.runtime.manager.close()
    assert tiers["disk"].used_bytes == mem.disk
    # the host tier at registration: its payloads and the window, before the chunk in flight
    # moved to the accelerator (the spare payload is beside the tier's books)
    assert tiers["host"].peak_bytes == mem.host + gem.in_flight - gem.spare
    # the emulated accelerator, the host and the mapped disk payloads are all live storages
    predicted = mem.device_total + mem.host + mem.disk - mem.read_ahead
    assert predicted == pytest.approx(min(peaks[1:]), rel=0.01)
