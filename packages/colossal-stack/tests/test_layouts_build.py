"""The layouts ``colossal plan`` lists for a tiny GPT (GPT-nano: 2 blocks, sequence 32, fp32)
build through the training job's flags and plugins and train one step, on 4 and 8 gloo ranks
(one World per size, shared; meshes share their process groups: colossal-parallel's [Note:
shared groups]). ``one_step_each`` and the lists are in ``benchmarks/_layouts_runs.py``.

Every listed layout (140 on 4 ranks, 212 on 8, Gemini with a grid tp over dp ranks among them:
``dp2 tp4-2d``, a kind 4 ranks list only at dp1) builds and trains a step, in CI (about three
minutes on two cores in the shared worlds). The covering sample (one layout for every kind the
lists compose: tp mode x sequence parallelism x pipeline schedule x ZeRO stage or Gemini) that
``benchmarks/run.py layouts --quick`` builds is checked to cover them. ``colossal train --layout
auto`` on 4 ranks trains, its loss falls, and its layout is in metrics.jsonl (checks in
``_checks_layouts.py``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from _checks_layouts import train_auto

from colossal.plan._layout import METHODS, parse_layout

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
from _layouts_runs import BASE, axis_key, covering_sample, listed_layouts, one_step_each

# Gemini over dp with a grid tp: a kind 4 ranks lists only at dp1 (colossal-parallel's
# [Note: operators a mode sees]: its first backward failed before)
GRID_GEMINI_OVER_DP = "dp2 tp4-2d gemini mb2x1"


def _samples() -> dict[int, list[str]]:
    four = covering_sample(listed_layouts(4))
    eight = covering_sample(listed_layouts(8), frozenset(axis_key(t) for t in four))
    return {4: four, 8: [*eight, GRID_GEMINI_OVER_DP]}


BATCH = 16  # layouts per call of the world: each call must answer within its time-out


def _trains(world, size: int, texts: list[str]) -> None:
    done: dict[str, dict] = {}
    for i in range(0, len(texts), BATCH):
        done |= world(size).run(one_step_each, texts[i : i + BATCH], BASE, True)[0]
    failed = {t: r["error"] for t, r in done.items() if r["error"] is not None}
    assert set(done) == set(texts) and not failed, failed


def test_the_ci_sample_covers_every_kind_the_lists_compose():
    samples = _samples()
    for size, texts in samples.items():
        listed = listed_layouts(size)
        assert set(texts) <= set(listed)
    kinds = {axis_key(t) for t in listed_layouts(4) + listed_layouts(8)}
    assert {axis_key(t) for t in samples[4] + samples[8]} == kinds
    picked = samples[4] + samples[8]
    assert len(picked) < (len(listed_layouts(4)) + len(listed_layouts(8))) / 4
    assert {parse_layout(t).method for t in picked} == set(METHODS)
    assert 4 <= sum(t.endswith(" ckpt") for t in picked) < len(picked) / 2
    assert picked == [*covering_sample(listed_layouts(4)), *samples[8]]  # deterministic


@pytest.mark.slow
@pytest.mark.parametrize("size", [4, 8])
def test_every_listed_layout_builds_and_trains_a_step(world, size):
    listed = listed_layouts(size)
    assert len(listed) > 100  # GPT-nano on 4 ranks lists 140, on 8 ranks 212
    assert size == 4 or GRID_GEMINI_OVER_DP in listed
    _trains(world, size, listed)


def test_layout_auto_trains_and_records_its_layout(world, tmp_path, small_corpus):
    kw = {**BASE, "steps": 8, "batch_size": 8, "corpus": small_corpus, "out": tmp_path / "auto"}
    kw["lr"] = 3e-3
    out = world(4).run(train_auto, kw)
    losses = out[0]["losses"]
    assert len(losses) == 8 and losses[-1] < losses[0]
    records = [
        json.loads(x) for x in (tmp_path / "auto" / "metrics.jsonl").read_text().split("\n") if x
    ]
    assert records and all(r["layout"] == records[0]["layout"] for r in records)
    assert records[0]["layout"].startswith("dp")
