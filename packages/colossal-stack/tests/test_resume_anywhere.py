"""Resume anywhere from the command line: a ``colossal train`` checkpoint of one layout and
plugin continues under another (including one process), with the losses of the run that was
not interrupted ([Note: layout checkpoint]: the hybrid plugin and Gemini with tp write blocks of
the unsharded tensors; every plugin reads them, and the DDP, ZeRO and mesh-less Gemini formats
through the same reader, [Note: one reader] in ``colossal.checkpoint._layout_legacy``).

Each case trains 4 steps with a checkpoint at step 2, then a copy of the run resumes from
step 2 under the other layout; both layouts have the same data-parallel size, so they train on
the same global batches. Weight decay is 0: the hybrid plugin and Gemini with tp decay every
parameter in one group, the other plugins leave norms and biases undecayed, so only without it
is the same optimizer continued. Tolerance 1e-5 relative (fp32; the layouts sum in other
orders, see test_hybrid_plugin.py's [Note: hybrid tolerances]).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from _checks_train_mesh import train_on_mesh

from colossal import TrainConfig, train

STEPS, HALF, TOL = 4, 2, 1e-5
BASE = {"steps": STEPS, "batch_size": 2, "seq_len": 32, "checkpoint_every": HALF}
BASE |= {"weight_decay": 0.0, "export": "none"}

# name -> (preset, (ranks, settings) that save, (ranks, settings) that resume; 1 rank: here)
CASES = {
    "tp2-pp2-to-one-process-gemini": (
        "nano",
        (4, {"tp": 2, "pp": 2, "microbatches": 2}),
        (1, {"plugin": "gemini"}),
    ),
    "gemini-tp2-to-gemini-tp4": (
        "micro",
        (2, {"plugin": "gemini", "tp": 2}),
        (4, {"plugin": "gemini", "tp": 4}),
    ),
    "ring-sp2-dp2-to-zero2-dp2": (
        "nano",
        (4, {"sp": "ring", "sp_size": 2}),
        (2, {"plugin": "zero", "zero": 2}),
    ),
    "tp2-to-one-process-hybrid": ("nano", (2, {"tp": 2}), (1, {"plugin": "hybrid"})),
    "gemini-ring-sp2-to-one-process-ddp": (
        "nano",
        (2, {"plugin": "gemini", "sp": "ring", "sp_size": 2}),
        (1, {"plugin": "ddp"}),
    ),
    # the formats written without a mesh ([Note: one reader]): DDP's whole tensors, and the
    # sharded runs of Gemini and ZeRO (over dp2: runs that cut tensors mid-row)
    "ddp-to-tp2-pp2": ("nano", (1, {"plugin": "ddp"}), (4, {"tp": 2, "pp": 2, "microbatches": 2})),
    "ddp-to-gemini-tp2": ("nano", (1, {"plugin": "ddp"}), (2, {"plugin": "gemini", "tp": 2})),
    "zero2-dp2-to-tp2-dp2": ("nano", (2, {"plugin": "zero", "zero": 2}), (4, {"tp": 2})),
    "zero1-to-gemini-tp2": (
        "nano",
        (1, {"plugin": "zero", "zero": 1}),
        (2, {"plugin": "gemini", "tp": 2}),
    ),
    "gemini-dp2-to-gemini-tp2-dp2": (
        "nano",
        (2, {"plugin": "gemini"}),
        (4, {"plugin": "gemini", "tp": 2}),
    ),
    "gemini-to-one-process-hybrid": ("nano", (1, {"plugin": "gemini"}), (1, {"plugin": "hybrid"})),
    "gemini-to-one-process-ddp": ("nano", (1, {"plugin": "gemini"}), (1, {"plugin": "ddp"})),
    "gemini-ring-sp2-tp2-to-one-process-ddp": (
        "nano",
        (4, {"plugin": "gemini", "tp": 2, "sp": "ring", "sp_size": 2}),
        (1, {"plugin": "ddp"}),
    ),
    "ddp-to-one-process-zero2": (
        "nano",
        (1, {"plugin": "ddp"}),
        (1, {"plugin": "zero", "zero": 2}),
    ),
}


# ... and on 8 ranks (slow): Gemini dp2 x tp4 on a 2D grid, whose vector parameters
# (LayerNorm and linear biases) are cut over the grid's rows and columns; a batch of 4 splits
# over dp2 and the grid's rows. (A bias-free model's grid checkpoint: test_grid_checkpoint.py)
GRID = {"batch_size": 4, "plugin": "gemini"}
SLOW_CASES = {
    "gemini-2d-tp4-dp2-to-gemini-tp2-dp2": (
        "nano",
        (8, {**GRID, "tp": 4, "tp_mode": "2d"}),
        (4, {**GRID, "tp": 2}),
    ),
}
PARAMS = [
    *CASES,
    *(pytest.param(n, marks=pytest.mark.slow) for n in SLOW_CASES),  # 13 s on two cores
]


def _run(world, ranks: int, kw: dict) -> list[float]:
    if ranks == 1:
        return train(TrainConfig.from_flags(**kw)).losses
    return world(ranks).run(train_on_mesh, kw)[0]["losses"]


@pytest.mark.parametrize("name", PARAMS)
def test_a_checkpoint_resumes_under_another_layout_with_the_same_losses(
    world, tmp_path, small_corpus, name
):
    preset, (n_save, save), (n_load, load) = (CASES | SLOW_CASES)[name]
    first = tmp_path / "first"
    kw = {**BASE, "preset": preset, "corpus": small_corpus}
    full = _run(world, n_save, {**kw, **save, "out": first})
    second = tmp_path / "second"
    shutil.copytree(first, second)
    (second / "checkpoint" / "latest").write_text(f"step-{HALF}\n")
    resumed = _run(world, n_load, {**kw, **load, "out": second, "resume": True})
    assert len(resumed) == STEPS - HALF
    for got, want in zip(resumed, full[HALF:], strict=True):
        assert abs(got - want) <= TOL * abs(want), (resumed, full)
    assert Path(second / "metrics.jsonl").read_text().count("\n") == STEPS
