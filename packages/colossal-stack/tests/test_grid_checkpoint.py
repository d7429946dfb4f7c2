"""Gemini with a grid tensor-parallel layout writes layout-independent checkpoints that any
layout resumes (checks in ``_checks_grid_checkpoint.py``): GPT trained under Gemini dp2 x tp4
(2D, SUMMA grid) on 8 ranks, saved at step 3, loads in one plain process with exactly the
saved fp32 masters and trains on with the losses of the run that was not interrupted; it
resumes under Gemini dp2 x tp2 (1D) and under Gemini tp8 (3D, and 2.5D with depth 2), whose
own checkpoints load in one process again. Both GPTs run: bias-free (its grid LayerNorms hold a
frozen zero bias the unsharded model lacks, which left every Gemini grid checkpoint
unloadable: [Note: parameters without pieces] in ``colossal.checkpoint._layout``), and with
biases (LayerNorm and linear biases are grid vector parameters, [Note: vector parameters] in
colossal-parallel). Losses within 1e-5 relative (fp32; the layouts sum in other orders, see
test_hybrid_plugin.py's [Note: hybrid tolerances]; measured <= 1e-7). A checkpoint missing
blocks is refused naming the parameter and the elements missing.

The module takes about 25 s on two cores (two 2D runs, six resumes, and starting the 4- and
8-rank worlds when no earlier test did), so it is ``slow`` but in CI.
"""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
from _checks_grid_checkpoint import LAYERS, gemini_run
from _checks_hybrid import CLIP, batches
from _checks_hybrid_checkpoint import make_model
from _stack_reference import adamw_losses

from colossal import load_layout_checkpoint
from colossal.booster import read_layout_index
from colossal_contracts import CheckpointError
from colossal_zero import GeminiConfig

pytestmark = pytest.mark.slow

STEPS, HALF, TOL = 6, 3, 1e-5
STATIC = GeminiConfig(placement="static", accelerator_bytes=160 << 10)
GRID_2D = {"tp_size": 4, "tp_mode": "2d", "config": STATIC}  # dp2 on 8 ranks
GRIDS_8 = {  # the other grids of 8 ranks: tp mode -> settings
    "3d": {"tp_size": 8, "tp_mode": "3d", "config": STATIC},
    "2.5d": {"tp_size": 8, "tp_mode": "2.5d", "tp_depth": 2, "config": STATIC},
}
TP2_1D = {"tp_size": 2, "config": STATIC}  # dp2 on 4 ranks


def _close(got: list[float], want: list[float]) -> float:
    return max(abs(a - b) / abs(b) for a, b in zip(got, want, strict=True))


@pytest.fixture(scope="module", params=[False, True], ids=["bias-free", "biases"])
def grid2d(request, world, tmp_path_factory):
    """Gemini dp2 x tp4 (2D): 6 steps, saved after step 3: (bias, root, rank 0's report)."""
    root = tmp_path_factory.mktemp("grid2d")
    kw = {"bias": request.param, "first": 0, "last": STEPS, "save": str(root), "save_step": HALF}
    out = world(8).run(gemini_run, GRID_2D, **kw)
    assert out[0]["mesh"] == "dp2 x tp4(2d), gemini"
    return request.param, root, out[0]


def test_the_index_covers_every_parameter_once(grid2d):
    bias, root, _ = grid2d
    index = read_layout_index(root / f"step-{HALF}")
    numel = {n: p.numel() for n, p in make_model(bias=bias, layers=LAYERS).named_parameters()}
    assert set(index["params"]) == set(numel)  # no grid-only frozen bias
    for kind in ("param", "exp_avg", "exp_avg_sq"):
        written = {
            n: sum(math.prod(b[3]) for b in blocks) for n, blocks in index["tensors"][kind].items()
        }
        assert written == numel, kind
    assert set(index["steps"].values()) == {float(HALF)}


def test_it_loads_in_one_process_as_saved_and_trains_on(grid2d):
    bias, root, first = grid2d
    model = make_model(bias=bias, seed=7, layers=LAYERS)
    opt = torch.optim.AdamW(model.parameters(), lr=1.0)  # lr comes from the checkpoint
    load_layout_checkpoint(root / f"step-{HALF}", model, opt)
    for n, p in model.named_parameters():
        assert torch.equal(p.detach(), first["full"][n]), n  # the fp32 masters, bit for bit
        assert float(opt.state[p]["step"]) == HALF
    losses = adamw_losses(model, batches(STEPS)[HALF:], opt, clip=CLIP)
    assert _close(losses, first["losses"][HALF:]) <= TOL, (losses, first["losses"])


def test_it_resumes_under_gemini_dp2_tp2_1d(world, grid2d):
    bias, root, first = grid2d
    out = world(4).run(gemini_run, TP2_1D, bias=bias, first=HALF, last=STEPS, load=str(root))
    assert out[0]["mesh"] == "dp2 x tp2(1d), gemini"
    assert _close(out[0]["losses"], first["losses"][HALF:]) <= TOL, out[0]["losses"]


@pytest.mark.parametrize("mode", list(GRIDS_8))
def test_it_resumes_under_gemini_tp8_grids_whose_checkpoints_load_in_one_process(
    world, grid2d, tmp_path, mode
):
    bias, root, first = grid2d
    kw = {"bias": bias, "first": HALF, "last": STEPS, "load": str(root), "save": str(tmp_path)}
    got = world(8).run(gemini_run, GRIDS_8[mode], **kw)[0]
    assert got["mesh"] == f"dp1 x tp8({mode}), gemini"
    assert _close(got["losses"], first["losses"][HALF:]) <= TOL, got["losses"]
    model = make_model(bias=bias, seed=7, layers=LAYERS)
    load_layout_checkpoint(tmp_path / f"step-{STEPS}", model)
    for n, p in model.named_parameters():
        assert torch.equal(p.detach(), got["full"][n]), n


def test_a_checkpoint_missing_blocks_is_refused_naming_what_is_missing(grid2d, tmp_path):
    _, root, _ = grid2d
    copy = tmp_path / "copy"
    shutil.copytree(root / f"step-{HALF}", copy)
    index = json.loads((copy / "layout_index.json").read_text())
    blocks = index["tensors"]["exp_avg"]["blocks.0.ln1.weight"]
    lost = blocks.pop()
    (copy / "layout_index.json").write_text(json.dumps(index))
    where = rf"\[{lost[2][0]}\]\+\[{lost[3][0]}\]"
    match = rf"exp_avg of 'blocks\.0\.ln1\.weight' cover \d+ of its 32 elements \(missing: {where}"
    with pytest.raises(CheckpointError, match=match):
        load_layout_checkpoint(copy, make_model(bias=False, layers=LAYERS))
