"""Layouts that ``colossal plan`` lists for a tiny GPT, and the rank-side run that builds each
through the training job's flags and plugin and trains one step; shared by ``bench_layouts``
(every listed layout, 4 and 8 ranks) and the stack's ``test_layouts_build`` (every listed
layout outside CI; in CI ``covering_sample``: one layout per kind composed)."""

from __future__ import annotations

import math
import re
import time
from collections import Counter
from typing import Any

import torch

from colossal import Booster, TrainConfig, build_plugin
from colossal.plan import PlanRequest, evaluate, model_shape
from colossal.plan._layout import METHODS, enumerate_layouts, parse_layout
from colossal.train._layout import layout_flags, local_hardware, train_shape
from colossal.train._models import resolve_model
from colossal_models import ByteTokenizer

BASE = {"model": "gpt", "preset": "nano", "seq_len": 32, "steps": 1}
GLOBAL_BATCH = 4


def listed_layouts(world: int, base: dict[str, Any] = BASE) -> list[str]:
    """Every layout ``colossal plan`` lists for ``base``'s model on ``world`` ranks (fp32), as
    ``describe()`` text, sorted; of the layouts that differ only in how a step's samples are cut
    into pipeline micro-batches, one: the one with the most ("mb1x4" sorts first)."""
    shape = model_shape(base["model"], base["preset"])
    listed = enumerate_layouts(
        world,
        layers=shape.layers,
        heads=shape.heads,
        seq_len=base["seq_len"],
        global_batch=GLOBAL_BATCH,
        precision="fp32",
    )
    by_split: dict[str, str] = {}
    for text in sorted({lay.describe() for lay in listed}):
        by_split.setdefault(re.sub(r" mb\d+x\d+", "", text), text)
    return sorted(by_split.values())


def mesh_of(text: str) -> str:
    """The device mesh part of a layout's text: ``dp2 tp2`` of ``dp2 tp2 zero1 mb2x1 ckpt``."""
    return text.split(f" {parse_layout(text).method} ")[0]


def sample(texts: list[str], per_method: int = 2, ckpt_every: int = 4) -> list[str]:
    """A few of ``texts`` that still show every distinct thing: every mesh once, its memory
    method taken in turn (the least used so far that the mesh lists), then more meshes for
    any method shown on fewer than ``per_method``; every ``ckpt_every``-th pick with
    activation checkpointing (its ``ckpt`` variant, where listed). More meshes go to the
    meshes picked least so far."""
    plain = [t for t in texts if not t.endswith(" ckpt")]
    by_mesh: dict[str, dict[str, str]] = {}
    for text in plain:
        by_mesh.setdefault(mesh_of(text), {})[parse_layout(text).method] = text
    used: Counter[str] = Counter()
    picks: list[str] = []
    for methods in by_mesh.values():
        method = min(methods, key=lambda m: (used[m], METHODS.index(m)))
        used[method] += 1
        picks.append(methods[method])
    on_mesh = Counter(
        dict.fromkeys(by_mesh, 1)
    )  # picks per mesh: the extra ones go to the least picked
    for method in METHODS:
        for mesh in sorted(by_mesh, key=lambda m: on_mesh[m]):
            if used[method] >= per_method:
                break
            if method in by_mesh[mesh] and by_mesh[mesh][method] not in picks:
                used[method] += 1
                on_mesh[mesh] += 1
                picks.append(by_mesh[mesh][method])
    listed = set(texts)
    return [
        f"{t} ckpt" if i % ckpt_every == ckpt_every - 1 and f"{t} ckpt" in listed else t
        for i, t in enumerate(picks)
    ]


def axis_key(text: str) -> tuple[str, str, str, str]:
    """What a layout composes, by kind: tp mode, sequence parallelism, pipeline schedule and
    sharding (``gemini`` for every Gemini placement), as the capability table names them."""
    c = parse_layout(text).combination("fp32")
    return c.tp, c.sp, c.pp, c.sharding


def covering_sample(
    texts: list[str], skip: frozenset[tuple[str, str, str, str]] = frozenset(), ckpt_every: int = 4
) -> list[str]:
    """One layout of ``texts`` per ``axis_key`` not in ``skip``, deterministic: keys in sorted
    order; within a key the method used least so far (so Gemini's placements take turns), then
    the mesh used least so far, then the first in sorted order; every ``ckpt_every``-th pick
    with activation checkpointing (its ``ckpt`` variant, where listed)."""
    by_key: dict[tuple[str, str, str, str], list[str]] = {}
    for text in sorted(t for t in texts if not t.endswith(" ckpt")):
        by_key.setdefault(axis_key(text), []).append(text)
    methods: Counter[str] = Counter()
    meshes: Counter[str] = Counter()
    picks: list[str] = []
    for key in sorted(k for k in by_key if k not in skip):
        pick = min(
            by_key[key],
            key=lambda t: (methods[parse_layout(t).method], meshes[mesh_of(t)], t),
        )
        methods[parse_layout(pick).method] += 1
        meshes[mesh_of(pick)] += 1
        picks.append(pick)
    listed = set(texts)
    return [
        f"{t} ckpt" if i % ckpt_every == ckpt_every - 1 and f"{t} ckpt" in listed else t
        for i, t in enumerate(picks)
    ]


def _one_step(text: str, base: dict[str, Any]) -> float:
    world = torch.distributed.get_world_size()
    shape = train_shape(base["model"], base["preset"], ByteTokenizer.vocab_size)
    lay = parse_layout(text)
    req = PlanRequest(shape, local_hardware(world, base, None), world, GLOBAL_BATCH,
                      base["seq_len"], precision="fp32")  # fmt: skip
    cfg = TrainConfig.from_flags(**{**base, **layout_flags(lay, evaluate(req, lay))})
    spec = resolve_model(cfg.model.name, cfg.model.preset, vocab_size=ByteTokenizer.vocab_size)
    plugin = build_plugin(cfg.parallel.plugin, cfg)
    try:
        torch.manual_seed(0)
        model = spec.build()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        booster = Booster(plugin)
        model, opt = booster.boost(model, opt)
        g = torch.Generator().manual_seed(1)
        x = torch.randint(
            0, ByteTokenizer.vocab_size, (cfg.data.batch_size, cfg.data.seq_len), generator=g
        )
        loss = float(booster.execute_pipeline(x, x, model, opt))  # any layout
        opt.step()
    finally:
        if hasattr(plugin, "close"):
            plugin.close()
    if not math.isfinite(loss):
        raise ArithmeticError(f"layout {text!r}: the step's loss is {loss}")
    return loss


def one_step_each(
    layouts: list[str], base: dict[str, Any] = BASE, keep_going: bool = False
) -> dict[str, dict[str, Any]]:
    """Build each layout (``describe()`` text) through the job's flags and plugin and train one
    step on a fixed batch (run on every rank of a world). Per layout: ``loss`` (this rank's; the
    dp mean is not taken), ``seconds`` and ``error`` (None, or the error's first line; with
    ``keep_going`` False the first error is raised instead)."""
    out: dict[str, dict[str, Any]] = {}
    for text in layouts:
        t0 = time.perf_counter()
        loss, error = None, None
        try:
            loss = _one_step(text, base)
        except Exception as err:
            if not keep_going:
                raise
            error = f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0]}"
        out[text] = {"loss": loss, "seconds": time.perf_counter() - t0, "error": error}
    return out
