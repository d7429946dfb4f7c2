"""Every layout ``colossal plan`` lists for a tiny GPT on 4 ranks builds through the training
job's flags and plugins and trains a step (one shared World); ``colossal train --layout auto``
on 4 ranks trains, its loss falls, and its layout is in metrics.jsonl (checks in
``_checks_layouts.py``)."""

from __future__ import annotations

import json

from _checks_layouts import one_step_each, train_auto

from colossal.plan import model_shape
from colossal.plan._layout import enumerate_layouts

BASE = {"model": "gpt", "preset": "nano", "seq_len": 32, "steps": 1}


def test_every_listed_layout_builds_and_trains_a_step(world):
    shape = model_shape("gpt", "nano")
    listed = enumerate_layouts(
        4, layers=shape.layers, heads=shape.heads, seq_len=32, global_batch=4, precision="fp32"
    )
    texts = sorted({lay.describe() for lay in listed})
    assert any("ring" in t for t in texts) and any("pp2" in t for t in texts)
    assert any("gemini-disk" in t for t in texts) and any("tp4-2d" in t for t in texts)
    out = world(4).run(one_step_each, texts, BASE)
    assert set(out[0]) == set(texts)


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
