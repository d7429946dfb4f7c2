"""The Gemini plugin through the Booster: trains, reports memory, checkpoints (sharded + the streamed
full-model export plain PyTorch loads), and rejects bad settings before training."""

from __future__ import annotations

import pytest
import torch
from _boosted import boost_nano, boosted_losses
from safetensors.torch import load_file

from colossal import GeminiPlugin
from colossal.booster import GeminiConfig, load_sharded_safetensors, parse_bytes
from colossal_contracts import ConfigError
from colossal_models import GPT, GPTConfig

BF16_2_5MIB = GeminiConfig(precision="bf16", accelerator_bytes=parse_bytes("2.5MiB"))


def test_trains_under_a_budget_and_reports_tiers_and_moves():
    booster, model, opt = boost_nano(
        GeminiPlugin(config=GeminiConfig(accelerator_bytes=parse_bytes("2.5MiB")))
    )
    losses = boosted_losses(booster, model, opt, 8)
    stats = booster.memory_stats()
    assert losses[-1] < losses[0]
    assert 0 < stats["accelerator_peak_bytes"] <= 2.5 * 2**20
    assert stats["accelerator_emulated"] is (not torch.cuda.is_available())
    assert stats["bytes_moved"] > 0 and stats["bytes_moved_total"] >= stats["bytes_moved"]


def test_checkpoint_resume_is_exact_and_full_model_loads_in_plain_torch(tmp_path):
    plugin = GeminiPlugin(config=BF16_2_5MIB, export_shard_bytes="96KiB")
    booster, model, opt = boost_nano(plugin)
    boosted_losses(booster, model, opt, 3)
    path = booster.save(model, opt, tmp_path, step=3)
    want = model.full_state_dict()
    after = boosted_losses(booster, model, opt, 3, start=3)

    b2, m2, o2 = boost_nano(GeminiPlugin(config=BF16_2_5MIB), seed=5)
    info = b2.load(m2, o2, tmp_path)
    assert info["step"] == 3
    assert boosted_losses(b2, m2, o2, 3, start=3) == after

    # the streamed export: every name (tied ones too) bit-identical to the gathered state,
    # in bounded shards (one tensor over the bound is a shard of its own)
    exported = load_sharded_safetensors(path)
    assert set(exported) == set(want)
    assert all(torch.equal(exported[n], want[n]) for n in want)
    shards = sorted(path.glob("model-*-of-*.safetensors"))
    assert len(shards) > 1
    for f in shards:
        part = load_file(str(f))
        assert len(part) == 1 or sum(t.numel() * 4 for t in part.values()) <= 96 * 1024
    plain = GPT(GPTConfig.preset("nano"))
    plain.load_state_dict(exported, strict=True)


@pytest.mark.parametrize(
    ("text", "value"), [("512MiB", 512 * 2**20), ("2GB", 2 * 10**9), ("1.5GiB", 3 * 2**29)]
)
def test_parse_bytes(text, value):
    assert parse_bytes(text) == value


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: GeminiConfig(placement="greedy"), "unknown placement 'greedy'"),
        (lambda: GeminiConfig(precision="fp8"), "unknown precision 'fp8'"),
        (lambda: GeminiConfig(accelerator_bytes=parse_bytes("lots")), "cannot read 'lots'"),
    ],
)
def test_bad_settings_are_clear_errors(make, match):
    with pytest.raises(ConfigError, match=match):
        GeminiPlugin(config=make())


def test_budget_below_one_chunk_fails_before_training():
    with pytest.raises(ConfigError, match="cannot hold one chunk"):
        boost_nano(GeminiPlugin(config=GeminiConfig(accelerator_bytes=16 << 10)))


def test_train_job_with_gemini_flags_logs_tiers_and_moves(tmp_path, small_corpus):
    import json

    from colossal import TrainConfig, train

    cfg = TrainConfig.from_flags(
        preset="nano",
        steps=6,
        batch_size=4,
        seq_len=32,
        corpus=small_corpus,
        out=tmp_path / "run",
        plugin="gemini",
        placement="static",
        accelerator_budget="1.8MiB",  # ~1.5 MiB of it is kept for activations
        precision="bf16",
    )
    result = train(cfg)
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 6 and all(r["bytes_moved"] > 0 for r in lines)
    budget = int(1.8 * 2**20)
    assert all(
        0 < r["accelerator_peak_bytes"] + r["non_model_reserved_bytes"] <= budget for r in lines
    )
    assert all(r["host_peak_bytes"] > 0 for r in lines)
    assert (tmp_path / "run" / "memory_timeline.png").stat().st_size > 0
    assert result.losses[-1] < result.losses[0]


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"placement": "lazy"}, "unknown --placement 'lazy'"),
        ({"precision": "fp8"}, "--precision"),
        ({"states_placement": "gpu"}, "unknown --states-placement 'gpu'"),
    ],
)
def test_train_config_rejects_unknown_gemini_settings(kw, match):
    from colossal import TrainConfig

    with pytest.raises(ConfigError, match=match):
        TrainConfig.from_flags(**kw)


def test_gemini_disk_layout_keeps_the_states_where_the_plan_split_them():
    # [Note: layout flags]: the host budget the planner split the tiers under, states kept there
    from colossal import TrainConfig, build_plugin
    from colossal.plan import PlanRequest, evaluate, from_gpt_config
    from colossal.plan._hardware import Hardware
    from colossal.plan._layout import parse_layout
    from colossal.train._layout import layout_flags
    from colossal_models import GPTConfig

    shape = from_gpt_config(GPTConfig.preset("nano"), "gpt-nano")
    lay = parse_layout("dp1 gemini-disk mb2x1")
    hw = Hardware("t", 1 << 34, 1e11, 1, 1e9, 1e9, 1e9, 0)
    plan = evaluate(PlanRequest(shape, hw, 1, 2, 64, 1.0, "fp32"), lay)
    flags = layout_flags(lay, plan)
    assert flags["host_budget"] == str(int(plan.memory.host_budget)) != "0"
    cfg = TrainConfig.from_flags(model="gpt", preset="nano", seq_len=64, **flags)
    assert build_plugin("gemini", cfg).config.states_placement == "host"


def test_a_states_placement_the_gemini_disk_layout_overrides_is_refused():
    from colossal.train._layout import apply_layout

    kw = {"model": "gpt", "preset": "nano", "seq_len": 64, "batch_size": 2, "disk_budget": "1GiB"}
    assert apply_layout("dp1 gemini-disk mb2x1", kw)["states_placement"] == "host"
    with pytest.raises(ConfigError, match="--states-placement demand conflicts with --layout"):
        apply_layout("dp1 gemini-disk mb2x1", {**kw, "states_placement": "demand"})


def test_budgeted_run_keeps_memtraces_activation_estimate_free(tmp_path, small_corpus):
    import json

    from colossal import TrainConfig, train

    cfg = TrainConfig.from_flags(
        preset="nano",
        steps=2,
        batch_size=4,
        seq_len=32,
        corpus=small_corpus,
        out=tmp_path / "run",
        accelerator_budget="2MiB",
    )
    train(cfg)
    rec = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    reserved = rec["non_model_reserved_bytes"]
    assert reserved > 0  # memtrace's estimate of the step's activations: the warmup's reserve
    # afterwards chunks get, at each moment, the budget minus that moment's measured activations
    # (integration_tests/test_gemini_per_moment.py checks the sum moment by moment)
    assert 0 < rec["accelerator_peak_bytes"] <= 2 * 2**20


def test_budget_below_the_activations_is_a_clear_error(tmp_path, small_corpus):
    from colossal import TrainConfig, train

    cfg = TrainConfig.from_flags(
        preset="nano", steps=1, batch_size=4, seq_len=32, corpus=small_corpus,
        out=tmp_path / "run", accelerator_budget="64KiB",
    )  # fmt: skip
    with pytest.raises(ConfigError, match="reserved for activations"):
        train(cfg)
