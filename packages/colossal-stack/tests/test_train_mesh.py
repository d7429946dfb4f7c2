"""``colossal train`` on a mesh: the training job (``colossal.train.train``) with tensor and
pipeline parallelism on a 4-rank world, against plain single-process AdamW on the global batch
(checks in ``_checks_train_mesh.py``), its metrics (mesh, per-axis bytes, the global batch counted
once), and on tp2 x pp2 a same-layout resume. The launch through ``colossal run`` on a tp2 mesh is test_cli.py's
(one launch checks both).

Tolerance: losses within 1e-5 relative (tensor parallelism sums its all-reduces in another order;
see test_hybrid_plugin.py).
"""

from __future__ import annotations

import json
import math

import pytest
from _checks_train_mesh import reference_losses, train_on_mesh

B, T, STEPS = 4, 32, 4

CASES = {
    # name: (TrainConfig settings, dp, expected mesh line, axes that must count bytes)
    "tp2-dp2-zero1": ({"tp": 2, "zero": 1}, 2, "dp2 x tp2(1d), zero1", ("dp", "tp")),
    "tp2-pp2": (
        {"tp": 2, "pp": 2, "microbatches": 2, "checkpoint_every": 2},
        1,
        "dp1 x tp2(1d) x pp2(1f1b, m=2)",
        ("tp", "pp"),
    ),
    # ZeRO-3 with tensor parallelism: Gemini's chunks hold the tp shards (its dp bytes are not
    # counted per axis)
    "gemini-tp2-dp2": ({"plugin": "gemini", "tp": 2}, 2, "dp2 x tp2(1d), gemini", ("tp",)),
    "palm-pp2-dp2-zero1": (
        {"model": "palm", "pp": 2, "microbatches": 2, "zero": 1},
        2,
        "dp2 x pp2(1f1b, m=2), zero1",
        ("dp", "pp"),
    ),
}


def _kw(tmp_path, corpus, name: str, **extra) -> dict:
    base = {"preset": "nano", "steps": STEPS, "batch_size": B, "seq_len": T, "corpus": corpus}
    return {**base, **CASES[name][0], "out": tmp_path / name, **extra}


@pytest.mark.parametrize("name", list(CASES))
def test_train_on_a_mesh_matches_single_process_adamw(world, tmp_path, small_corpus, name):
    kw = _kw(tmp_path, small_corpus, name)
    _, dp, mesh, axes = CASES[name]
    out = world(4).run(train_on_mesh, kw)
    losses = out[0]["losses"]
    assert all(o["losses"] == losses for o in out)  # every rank reports the dp mean
    base = ("model", "preset", "steps", "batch_size", "seq_len", "corpus")
    want = reference_losses({k: v for k, v in kw.items() if k in base}, dp)
    assert len(losses) == STEPS
    for got, ref in zip(losses, want, strict=True):
        assert abs(got - ref) <= 1e-5 * abs(ref), (losses, want)
    assert math.isfinite(out[0]["val_loss"])  # a pipelined model evaluates through the schedule
    records = out[0]["records"]
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    for r in records:
        assert r["mesh"] == mesh
        # tokens/s counts the global batch (batch_size sequences per dp coordinate) once
        assert r["tokens_per_s"] * r["step_time_s"] == pytest.approx(B * T * dp, rel=1e-9)
    for axis in axes:
        total = [r[f"comm_{axis}_bytes_total"] for r in records]
        assert 0 < total[0] < total[-1], (axis, total)
    counted = {a for a in ("dp", "tp", "pp", "sp") if f"comm_{a}_bytes_total" in records[-1]}
    assert counted == set(axes)
    if name == "tp2-pp2":  # it saves every 2 steps: a same-layout resume from step 2
        _resumes_with_the_same_losses(world, kw, losses)


def _resumes_with_the_same_losses(world, kw: dict, losses: list[float]) -> None:
    (kw["out"] / "checkpoint" / "latest").write_text("step-2\n")  # as if stopped at step 2
    resumed = world(4).run(train_on_mesh, {**kw, "resume": True})[0]
    assert resumed["losses"] == pytest.approx(losses[2:], rel=1e-6)
    records = [json.loads(x) for x in (kw["out"] / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
