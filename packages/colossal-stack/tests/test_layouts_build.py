"""Every layout ``colossal plan`` lists for a tiny GPT on 4 ranks builds through the training
job's flags and plugins and trains a step (one shared World; of the layouts that differ only
in how a step's samples are cut into pipeline micro-batches, one: the one with the most; activation
checkpointing on each mesh under one memory mode); ``colossal train --layout auto``
on 4 ranks trains, its loss falls, and its layout is in metrics.jsonl (checks in
``_checks_layouts.py``)."""

from __future__ import annotations

import json
import re

from _checks_layouts import one_step_each, train_auto

from colossal.plan import model_shape
from colossal.plan._layout import enumerate_layouts

BASE = {"model": "gpt", "preset": "nano", "seq_len": 32, "steps": 1}


def test_every_listed_layout_builds_and_trains_a_step(world):
    shape = model_shape("gpt", "nano")
    listed = enumerate_layouts(
        4, layers=shape.layers, heads=shape.heads, seq_len=32, global_batch=4, precision="fp32"
    )
    by_split: dict[str, str] = {}  # sorted: "mb1x4" (4 micro-batches) comes first
    for text in sorted({lay.describe() for lay in listed}):
        by_split.setdefault(re.sub(r" mb\d+x\d+", "", text), text)
    # activation checkpointing wraps the blocks whatever the memory mode: each mesh is built
    # under every memory mode without it, and with it under one of them (in turn)
    texts, ckpt_seen = [], set()
    for i, text in enumerate(sorted(by_split.values())):
        mesh = text.split(" ddp")[0].split(" zero")[0].split(" gemini")[0]
        if not text.endswith(" ckpt") or (mesh not in ckpt_seen and not ckpt_seen.add(mesh)):
            texts.append(text)
    assert len(texts) < len(by_split) and any(t.endswith(" ckpt") for t in texts)
    assert any("ring" in t for t in texts) and any("pp2" in t for t in texts)
    assert any("gemini-disk" in t for t in texts) and any("tp4-2d" in t for t in texts)
    assert any("tp2 ring2" in t for t in texts) and any("pp2 ulysses2" in t for t in texts)
    done: dict[str, float] = {}
    for first in range(0, len(texts), 32):  # one run call per 32 layouts: within its time-out
        done.update(world(4).run(one_step_each, texts[first : first + 32], BASE)[0])
    assert set(done) == set(texts)


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
