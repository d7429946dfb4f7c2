"""The ``hybrid`` benchmark's byte formulas (``benchmarks/_hybrid_bytes.py``) equal the bytes the
mesh counts, on one small layout that has three kinds of traffic: ring sequence parallelism
(point-to-point key/value blocks, the loss and gradients summed over sp) inside a 1F1B pipeline
(boundary activations, the tied embedding's gradient, the loss broadcast). Every layout of the
benchmark is compared in ``python benchmarks/run.py hybrid`` (its summary line)."""

from __future__ import annotations

import sys
from pathlib import Path

from colossal_models import GPTConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
from _hybrid_bytes import formula_bytes
from bench_hybrid import LAYOUTS, measure

NAME = "ring sp2 x pp2(1f1b)"


def test_counted_bytes_equal_the_formulas_on_ring_sp2_x_pp2(world):
    cfg = GPTConfig(vocab_size=64, max_seq_len=16, num_layers=2, num_heads=2, hidden_size=16)
    batch, seq = 4, 8
    per_rank = world(4).run(measure, True, 1, 1, batch, seq, names=[NAME], cfg=cfg)
    plugin, settings = LAYOUTS[NAME]
    formula = formula_bytes(cfg, plugin, settings, world=4, batch=batch, seq=seq)
    blocks = [r["results"][NAME][0] for r in per_rank]
    assert set(blocks[0]["counted_axes"]) == {"pp", "sp"} == set(formula)
    for axis in ("pp", "sp"):
        counted = sum(b["bytes"][axis] for b in blocks) / 4
        assert counted > 0
        assert counted == formula[axis], (axis, counted, formula[axis])
