"""Layout-independent checkpoints of ``HybridParallelPlugin`` (checks in
``_checks_hybrid_checkpoint.py``): trained on one layout, saved at step 5 through
``Booster.save``, resumed on another layout (or in one plain process) and trained on: the
losses equal one uninterrupted single-process AdamW run (clipping on) within 1e-5.
"""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
from _checks_hybrid_checkpoint import CLIP, LR, batches, hybrid_steps, make_model
from _stack_reference import adamw_losses
from safetensors.torch import load_file

from colossal import export_checkpoint, load_layout_checkpoint
from colossal.booster import read_layout_index
from colossal_contracts import CheckpointError
from colossal_models import GPT, GPTConfig

STEPS, SAVE = 10, 5
TP2_PP2 = {"tp_size": 2, "pp_size": 2, "microbatches": 2}
DP4_ZERO1 = {"zero_stage": 1}


def _reference(bias: bool) -> tuple[list[float], torch.nn.Module]:
    model = make_model(bias=bias)
    losses = adamw_losses(model, batches(STEPS), LR, clip=CLIP)
    return losses, model


def _close(got: list[float], want: list[float]) -> float:
    return max(abs(a - b) / abs(b) for a, b in zip(got, want, strict=True))


@pytest.fixture(scope="module")
def tp2_pp2_run(world, tmp_path_factory):
    root = tmp_path_factory.mktemp("tp2pp2")
    out = world(4).run(hybrid_steps, TP2_PP2, str(root), first=0, last=SAVE, bias=False, load=False)
    return root, out[0]


@pytest.fixture(scope="module")
def dp4_resume(world, tp2_pp2_run):
    """Steps 5..9 on dp4 with ZeRO-1 from the tp2 x pp2 checkpoint; saves step-10."""
    root, _ = tp2_pp2_run
    out = world(4).run(
        hybrid_steps, DP4_ZERO1, str(root), first=SAVE, last=STEPS, bias=False, load=True
    )
    return root, out[0]


def test_tp2_pp2_resumes_on_dp4_zero1(tp2_pp2_run, dp4_resume):
    ref, _ = _reference(False)
    assert _close(tp2_pp2_run[1], ref[:SAVE]) <= 1e-5
    assert _close(dp4_resume[1], ref[SAVE:]) <= 1e-5, (dp4_resume[1], ref[SAVE:])


@pytest.mark.parametrize(
    "settings",
    [
        {"tp_size": 4, "tp_mode": "2d"},
        {"tp_size": 2, "sequence_parallel": "megatron", "zero_stage": 2},
    ],
    ids=["2d-tp4", "megatron-tp2-dp2-zero2"],
)
def test_tp2_pp2_resumes_on_other_tp_layouts(world, tp2_pp2_run, tmp_path, settings):
    root, _ = tp2_pp2_run
    ref, _ = _reference(False)
    out = world(4).run(
        hybrid_steps,
        settings,
        str(root),
        first=SAVE,
        last=SAVE + 3,
        bias=False,
        load=True,
        save_root=str(tmp_path),
    )
    assert _close(out[0], ref[SAVE : SAVE + 3]) <= 1e-5, (out[0], ref[SAVE:])


def test_zero1_checkpoint_loads_in_one_process(dp4_resume):
    """ZeRO-1's flat dp shards, saved at step 10, are the uninterrupted run's weights."""
    root, _ = dp4_resume
    _, ref_model = _reference(False)
    model = make_model(bias=False, seed=7)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    index = load_layout_checkpoint(root / f"step-{STEPS}", model, opt)
    assert index["layout"] == "dp4, zero1"
    want = dict(ref_model.named_parameters())
    for n, p in model.named_parameters():  # 5e-5: tp's rounding in steps 0..4
        assert float((p - want[n]).norm() / want[n].norm()) <= 5e-5, n
        assert float(opt.state[p]["step"]) == STEPS


def test_tp2_pp2_resumes_in_one_plain_process(tp2_pp2_run):
    root, _ = tp2_pp2_run
    ref, ref_model = _reference(False)
    model = make_model(bias=False, seed=7)
    opt = torch.optim.AdamW(model.parameters(), lr=1.0)  # lr comes from the checkpoint
    load_layout_checkpoint(root / f"step-{SAVE}", model, opt)
    assert opt.param_groups[0]["lr"] == LR
    losses = adamw_losses(model, batches(STEPS)[SAVE:], opt, clip=CLIP)
    assert _close(losses, ref[SAVE:]) <= 1e-5, (losses, ref[SAVE:])
    want = dict(ref_model.named_parameters())
    with torch.no_grad():
        for n, p in model.named_parameters():  # 5e-5: tp's rounding, see test_hybrid_plugin.py
            assert float((p - want[n]).norm() / want[n].norm()) <= 5e-5, n


def test_every_element_is_written_once(tp2_pp2_run):
    """The saved blocks of each tensor are disjoint and cover it: the tied embedding (first and
    last stage) and the tp-replicated norms are written once."""
    root, _ = tp2_pp2_run
    index = read_layout_index(root / f"step-{SAVE}")
    model = make_model(bias=False)
    numel = {n: p.numel() for n, p in model.named_parameters()}
    assert set(index["params"]) == set(numel)
    for kind in ("param", "exp_avg", "exp_avg_sq"):
        written = {
            n: sum(math.prod(b[3]) for b in blocks) for n, blocks in index["tensors"][kind].items()
        }
        assert written == numel, kind
    assert {b[0] for bl in index["tensors"]["param"].values() for b in bl} == {
        f"layout-{r:05d}-of-00004.safetensors" for r in range(4)
    }
    assert set(index["steps"].values()) == {float(SAVE)}


@pytest.fixture(scope="module")
def tp2d_run(world, tmp_path_factory):
    """2D tp4 (a 2 x 2 grid), GPT with biases (so GPT-2 can take it), saved at step 3."""
    root = tmp_path_factory.mktemp("tp2d")
    settings = {"tp_size": 4, "tp_mode": "2d"}
    out = world(4).run(hybrid_steps, settings, str(root), first=0, last=3, bias=True, load=False)
    return root, out[0]


def test_2d_tp4_resumes_in_one_plain_process(tp2d_run):
    root, first = tp2d_run
    ref, _ = _reference(True)
    assert _close(first, ref[:3]) <= 1e-5
    model = make_model(bias=True, seed=7)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    load_layout_checkpoint(root / "step-3", model, opt)
    assert _close(adamw_losses(model, batches(STEPS)[3:], opt, clip=CLIP), ref[3:]) <= 1e-5


def test_export_round_trips_into_a_plain_model(tp2_pp2_run, tmp_path):
    root, _ = tp2_pp2_run
    loaded = make_model(bias=False, seed=7)
    load_layout_checkpoint(root / f"step-{SAVE}", loaded)
    limit = 40_000  # bytes: several shards for this ~100k-parameter model
    index_path = export_checkpoint(
        root / f"step-{SAVE}", tmp_path / "export", max_shard_bytes=limit
    )
    index = json.loads(index_path.read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 2 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    state: dict[str, torch.Tensor] = {}
    for f in files:
        part = load_file(str(tmp_path / "export" / f))
        one = next(iter(part.values()))
        assert len(part) == 1 or sum(t.numel() * 4 for t in part.values()) <= limit
        assert one.dtype == torch.float32
        state.update(part)
    fresh = make_model(bias=False, seed=11)
    fresh.load_state_dict(state, strict=True)
    for n, p in fresh.named_parameters():
        assert torch.equal(p, dict(loaded.named_parameters())[n]), n


def test_hf_export_loads_into_gpt2_with_the_same_logits(tp2d_run, tmp_path):
    transformers = pytest.importorskip("transformers")
    root, _ = tp2d_run
    ours = make_model(bias=True, seed=7)
    load_layout_checkpoint(root / "step-3", ours)
    export_checkpoint(root / "step-3", tmp_path / "hf", hf=True, max_shard_bytes="64KiB")
    hf = transformers.GPT2LMHeadModel.from_pretrained(str(tmp_path / "hf")).eval()
    ids = batches(1)[0][0]
    with torch.no_grad():
        want = ours.eval()(ids)
        got = hf(ids).logits
    assert got.shape == want.shape
    assert float((got - want).abs().max()) <= 1e-4


def test_damaged_or_foreign_checkpoints_are_checkpoint_errors(tp2_pp2_run, tmp_path):
    root, _ = tp2_pp2_run
    with pytest.raises(CheckpointError, match=r"layout_index\.json"):
        load_layout_checkpoint(tmp_path, make_model(bias=False))
    with pytest.raises(CheckpointError, match="lacks"):
        load_layout_checkpoint(root / f"step-{SAVE}", make_model(bias=False, layers=2))
    other = GPT(GPTConfig(vocab_size=64, max_seq_len=16, num_layers=4, num_heads=4, hidden_size=32))
    with pytest.raises(CheckpointError, match="does not match the checkpoint"):
        load_layout_checkpoint(root / f"step-{SAVE}", other)
    copy = tmp_path / "copy"
    shutil.copytree(root / f"step-{SAVE}", copy)
    (copy / "layout-00003-of-00004.safetensors").unlink()
    with pytest.raises(CheckpointError, match="missing or corrupt"):
        load_layout_checkpoint(copy, make_model(bias=False))
