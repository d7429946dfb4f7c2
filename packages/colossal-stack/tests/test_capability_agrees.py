"""The capability table ([Note: capability table]), the plugins' constructor checks, the
training job's flag checks and ``colossal plan``'s candidates agree on every combination of
tp mode, sequence parallelism, pipeline schedule, sharding, precision, activation
checkpointing and lazy init: each accepts exactly what the table builds, and a refusal names the
nearest combination that builds. No process group is made (constructors and configs only)."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from colossal import GeminiPlugin, HybridParallelPlugin, LowLevelZeroPlugin, TrainConfig, lazy_init
from colossal._capability import (
    PP_SCHEDULES,
    PRECISIONS,
    SHARDINGS,
    SP_KINDS,
    TP_KINDS,
    Combination,
    builds,
    check_combination,
    long_sequence,
    nearest,
)
from colossal.booster import GeminiConfig
from colossal.plan import model_shape
from colossal.plan._layout import enumerate_layouts
from colossal.train._layout import layout_flags
from colossal_contracts import ConfigError

ALL = [
    Combination(*v)
    for v in itertools.product(
        TP_KINDS, SP_KINDS, PP_SCHEDULES, SHARDINGS, PRECISIONS, (False, True), (False, True)
    )
]
TP_SIZES = {"none": (1, 1), "1d": (2, 1), "2d": (4, 1), "2.5d": (8, 2), "3d": (8, 1)}


def _accepts(make) -> bool:  # type: ignore[no-untyped-def]
    try:
        make()
    except ConfigError:
        return False
    return True


def _plugin_accepts(c: Combination) -> bool | None:
    """Whether the plugin that would run ``c`` constructs; None when no plugin has a setting
    for it (the table must then refuse it)."""
    tp, depth = TP_SIZES[c.tp]
    if c.sharding == "gemini":
        if c.pp != "none":
            return None  # GeminiPlugin has no such setting
        # activation checkpointing is the model's (the job applies it), not a plugin setting
        lazy = lazy_init() if c.lazy else None
        kw = dict(
            tp_size=tp,
            tp_mode="1d" if c.tp == "none" else c.tp,
            tp_depth=depth,
            sequence_parallel=None if c.sp == "none" else c.sp,
            sp_size=2 if long_sequence(c.sp) else 1,
        )
        config = lambda: GeminiConfig(precision=c.precision)  # noqa: E731
        return _accepts(lambda: GeminiPlugin(config=config(), lazy=lazy, **kw))
    lazy = lazy_init() if c.lazy else None  # ZeRO and hybrid fill a lazy model: [Note: lazy fill]
    kw = dict(
        tp_size=tp,
        tp_mode="1d" if c.tp == "none" else c.tp,
        tp_depth=depth,
        sequence_parallel=None if c.sp == "none" else c.sp,
        sp_size=2 if long_sequence(c.sp) else 1,
        pp_size=1 if c.pp == "none" else 2,
        microbatches=1 if c.pp == "none" else 2,
        schedule="1f1b" if c.pp == "none" else c.pp,
        zero_stage=int(c.sharding[-1]),
        precision=c.precision,
        activation_checkpointing=c.checkpointing,
        lazy=lazy,
    )
    hybrid = _accepts(lambda: HybridParallelPlugin(**kw))
    if c.sharding in ("zero1", "zero2") and c == Combination(
        sharding=c.sharding, precision=c.precision, lazy=c.lazy
    ):
        stage = int(c.sharding[-1])
        zero = lambda: LowLevelZeroPlugin(stage=stage, precision=c.precision, lazy=lazy)  # noqa: E731
        assert _accepts(zero) == hybrid
    return hybrid


def _job_accepts(c: Combination) -> bool:
    tp, depth = TP_SIZES[c.tp]
    kw = dict(
        tp=tp,
        tp_mode="1d" if c.tp == "none" else c.tp,
        tp_depth=depth,
        sp=None if c.sp == "none" else c.sp,
        sp_size=2 if long_sequence(c.sp) else 1,
        pp=1 if c.pp == "none" else 2,
        microbatches=1 if c.pp == "none" else 2,
        schedule="1f1b" if c.pp == "none" else c.pp,
        zero=3 if c.sharding == "gemini" else int(c.sharding[-1]),
        plugin="gemini" if c.sharding == "gemini" else None,
        precision=c.precision,
        activation_checkpointing=c.checkpointing,
        batch_size=4,
        seq_len=32,
        lora_rank=4 if c.lora else None,
    )
    return _accepts(lambda: TrainConfig.from_flags(**kw))


def test_the_table_covers_every_kind_and_refuses_some():
    assert len(ALL) == 5 * 6 * 4 * 4 * 3 * 2 * 2
    ok = [c for c in ALL if builds(c)]
    assert 0 < len(ok) < len(ALL)


@pytest.mark.parametrize("sharding", SHARDINGS)
def test_plugins_and_job_accept_exactly_what_the_table_builds(sharding):
    for c in (c for c in ALL if c.sharding == sharding):
        plugin = _plugin_accepts(c)
        assert (plugin is None and not builds(c)) or plugin == builds(c), c
        if not c.lazy:  # no flag: the job builds lazily itself ([Note: lazy job])
            assert _job_accepts(c) == builds(c), c


def test_the_job_accepts_exactly_what_the_table_builds_for_lora():
    """``--lora-rank`` rows: LoRA beside 1d tp on the hybrid plugin, not pp, sp, grid modes or
    Gemini with tp; a refusal keeps LoRA in the nearest combination. Every parallel kind and
    sharding, in bf16 without recomputation (the LoRA rows do not read those two fields)."""
    sample = [c for c in ALL if c.precision == "bf16" and not c.checkpointing and not c.lazy]
    for c in (dataclasses.replace(c, lora=True) for c in sample):
        assert _job_accepts(c) == builds(c), c
        assert nearest(c).lora, c


def test_a_refusal_names_the_nearest_combination_that_builds():
    for c in ALL:
        near = nearest(c)
        assert near is not None and builds(near)
        if builds(c):
            assert near == c
            check_combination(c)
            continue
        with pytest.raises(ConfigError, match="does not build") as err:
            check_combination(c)
        assert near.describe() in str(err.value) and "\n" not in str(err.value)
    # e.g. the top pick for GPT-3 175B, Megatron sp with Gemini, becomes ZeRO
    c = Combination(tp="1d", sp="megatron", sharding="gemini", precision="bf16")
    assert nearest(c) == Combination(tp="1d", sp="megatron", sharding="zero2", precision="bf16")


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_planner_lists_only_what_the_job_builds(precision):
    shape = model_shape("gpt", "nano")
    every = list(
        enumerate_layouts(
            8, layers=shape.layers, heads=shape.heads, seq_len=32, global_batch=8, precision=None
        )
    )
    listed = set(
        enumerate_layouts(
            8,
            layers=shape.layers,
            heads=shape.heads,
            seq_len=32,
            global_batch=8,
            precision=precision,
        )
    )
    assert listed and len(listed) < len(every)
    job_precision = precision
    for lay in every:
        flags = layout_flags(lay) if not lay.method.startswith("gemini-") else None
        if flags is None:
            assert (lay in listed) == builds(lay.combination(precision))
            continue
        ok = _accepts(lambda: TrainConfig.from_flags(**flags, precision=job_precision, seq_len=32))  # noqa: B023
        assert ok == (lay in listed), lay.describe()
