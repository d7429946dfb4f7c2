"""A sample of the layouts ``colossal plan`` lists for a tiny GPT on 4 ranks builds through the
training job's flags and plugins and trains a step (one shared World): every mesh once, its
memory method taken in turn so that each of ddp, zero1, zero2 and the Gemini placements is
built on two meshes or more, and activation checkpointing on a few (``sample`` in
``benchmarks/_layouts_runs.py``); ``colossal train --layout auto`` on 4 ranks trains, its loss
falls, and its layout is in metrics.jsonl (checks in ``_checks_layouts.py``). Every listed
layout, on 4 and on 8 ranks, is the ``layouts`` benchmark
(``python benchmarks/run.py layouts``)."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

from _checks_layouts import train_auto

from colossal.plan._layout import METHODS, parse_layout

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
from _layouts_runs import BASE, listed_layouts, mesh_of, one_step_each, sample


def test_a_sample_of_the_listed_layouts_builds_and_trains_a_step(world):
    listed = listed_layouts(4)
    texts = sample(listed)
    assert set(texts) <= set(listed) and len(texts) < len(listed) / 4
    assert {mesh_of(t) for t in texts} == {mesh_of(t) for t in listed}
    methods = Counter(parse_layout(t).method for t in texts)
    assert set(methods) == set(METHODS) and min(methods.values()) >= 2
    assert 2 <= sum(t.endswith(" ckpt") for t in texts) < len(texts) / 2
    assert any("ring" in t for t in texts) and any("pp2" in t for t in texts)
    assert any("gemini-disk" in t for t in texts) and any("tp4-2d" in t for t in texts)
    assert any("tp2 ring2" in t for t in texts) and any("pp2 ulysses2" in t for t in texts)
    done = world(4).run(one_step_each, texts, BASE)[0]
    assert set(done) == set(texts) and all(r["error"] is None for r in done.values())


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
