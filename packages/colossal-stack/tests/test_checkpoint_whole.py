"""Checkpoints load whole or not at all ([Note: whole or not at all]): a checkpoint edited with
its hashes recomputed (so no checksum catches it) is refused naming the file and the field, and
the model and optimizer are left exactly as they were."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from _one_step import boosted_one_step, weights
from safetensors.torch import load_file, save_file

from colossal import DDPPlugin, GeminiPlugin
from colossal.checkpoint import _publish
from colossal.checkpoint._layout import _check_whole
from colossal.checkpoint._layout_read import _cover_fault
from colossal_contracts import CheckpointError
from colossal_zero.checkpoint import INDEX_FILE, file_digest


def _reseal(path: Path) -> None:
    """Recompute the Gemini index's file digests and the manifest after an edit."""
    index_path = path / INDEX_FILE
    if index_path.exists():
        index = json.loads(index_path.read_text())
        index["files"] = {n: file_digest(path / n) for n in index["files"]}
        index_path.write_text(json.dumps(index))
    step = json.loads((path / _publish.MANIFEST).read_text())["step"]
    _publish._write_manifest(path, step)


def _refused_unchanged(plugin_factory, path: Path, match: str) -> None:  # type: ignore[no-untyped-def]
    booster, model, opt = boosted_one_step(plugin_factory(), seed=1)
    before = weights(model)
    with pytest.raises(CheckpointError, match=match) as info:
        booster.load(model, opt, path)
    assert "\n" not in str(info.value)
    after = weights(model)
    assert all(torch.equal(before[k], after[k]) for k in before), "the model was touched"


def _gemini_ckpt(tmp_path: Path) -> Path:
    booster, model, opt = boosted_one_step(GeminiPlugin())
    return booster.save(model, opt, tmp_path, step=1)


# the loading plugin: Gemini reads its own format; DDP reads it through [Note: one reader]
LOADERS = {"gemini": GeminiPlugin, "ddp": DDPPlugin}


@pytest.mark.parametrize("loader", list(LOADERS))
def test_gemini_index_that_leaves_a_tensor_half_covered_is_refused(tmp_path, loader):
    path = _gemini_ckpt(tmp_path)
    index = json.loads((path / INDEX_FILE).read_text())
    name, meta = next((n, m) for n, m in index["params"].items() if m["ranges"][0][2] > 4)
    meta["ranges"][0][2] -= 4  # the last four elements of its first range: no one's
    (path / INDEX_FILE).write_text(json.dumps(index))
    _reseal(path)
    match = {
        "gemini": f"gemini_index.json is malformed: the 'ranges' of '{name}' (leave a gap|cover)",
        "ddp": f"gemini_index.json: the blocks of param of '{name}' cover",
    }[loader]
    _refused_unchanged(LOADERS[loader], tmp_path, match)


@pytest.mark.parametrize("loader", list(LOADERS))
def test_gemini_shard_without_an_optimizer_state_is_refused(tmp_path, loader):
    path = _gemini_ckpt(tmp_path)
    shard = next(path.glob("gemini-rank*.safetensors"))
    tensors = load_file(str(shard))
    dropped = next(k for k in tensors if k.startswith("exp_avg_sq/"))
    del tensors[dropped]
    save_file(tensors, str(shard))
    _reseal(path)
    _refused_unchanged(LOADERS[loader], tmp_path, f"{re.escape(dropped)}'?]? is absent")


def test_ddp_optimizer_state_missing_for_one_parameter_is_refused(tmp_path):
    booster, model, opt = boosted_one_step()
    path = booster.save(model, opt, tmp_path, step=1)
    tensors = load_file(str(path / "optimizer.safetensors"))
    del tensors["state.3.exp_avg"]
    save_file(tensors, str(path / "optimizer.safetensors"))
    _reseal(path)
    _refused_unchanged(DDPPlugin, tmp_path, r"parameter 3 has state \['exp_avg_sq', 'step'\]")


@pytest.mark.parametrize(
    "edit,match",
    [
        (lambda m: m.update(format=2), r"manifest\.json: 'format' is 2, and this version reads"),
        (lambda m: m.update(step=7), r"manifest\.json: 'step' is 7, and its folder is step-1"),
        (lambda m: m.pop("step"), r"manifest\.json: 'step' is None"),
    ],
)
def test_manifest_of_unknown_format_or_another_step_is_refused(tmp_path, edit, match):
    booster, model, opt = boosted_one_step()
    path = booster.save(model, opt, tmp_path, step=1)
    manifest = json.loads((path / _publish.MANIFEST).read_text())
    edit(manifest)
    (path / _publish.MANIFEST).write_text(json.dumps(manifest))
    _refused_unchanged(DDPPlugin, path, match)


def test_trainer_state_of_another_step_is_refused(tmp_path):
    booster, model, opt = boosted_one_step()
    path = booster.save(model, opt, tmp_path, step=1)
    info = json.loads((path / "trainer.json").read_text())
    (path / "trainer.json").write_text(json.dumps({**info, "step": 5}))
    _reseal(path)
    _refused_unchanged(DDPPlugin, tmp_path, r"trainer\.json: 'step' is 5, and manifest\.json")


def test_missing_manifest_is_refused_naming_it(tmp_path):
    booster, model, opt = boosted_one_step()
    path = booster.save(model, opt, tmp_path, step=1)
    (path / _publish.MANIFEST).unlink()
    _refused_unchanged(DDPPlugin, path, r"step-1/manifest\.json is missing")
    _refused_unchanged(DDPPlugin, tmp_path, r"step-1/manifest\.json is missing")


@pytest.mark.parametrize(
    "blocks,fault",
    [
        ([["f", "k", [0, 0], [4, 3]]], None),
        ([["f", "k", [0, 0], [2, 3]], ["f", "k2", [2, 0], [2, 3]]], None),
        ([["f", "k", [0, 0], [2, 3]]], "cover 6 of its 12 elements (missing: [2, 0]+[2, 3])"),
        ([["f", "k", [1, 1], [2, 1]]], "(missing: [0, 0]+[1, 3], [3, 0]+[1, 3], [1, 0]+[2, 1] and"),
        ([["f", "k", [0, 0], [3, 3]], ["f", "k2", [2, 0], [2, 3]]], "overlap at [2, 0]"),
        (
            [["f", "k", [3, 0], [1, 3]], ["f", "k", [0, 0], [2, 3]], ["f", "k", [1, 2], [3, 1]]],
            "overlap at [1, 2]",
        ),
        ([["f", "k", [0, 0], [4, 4]]], "outside the shape"),
        (None, "are absent (none of its 12 elements is saved)"),
    ],
)
def test_layout_blocks_must_cover_each_element_once(blocks, fault):
    got = _cover_fault({"shape": [4, 3]}, blocks)
    assert (got is None) if fault is None else (fault in got), got


def test_a_writer_whose_blocks_miss_a_tensor_refuses_naming_it():
    """Every rank runs the same check on the blocks all ranks hold, before any file is written
    ([Note: parameters without pieces])."""
    shapes = {"w": [4, 3], "ln.bias": [8]}
    whole = {"w": [["f", "k", [0, 0], [4, 3]]], "ln.bias": [["f", "b", [0], [8]]]}
    _check_whole(shapes, {"param": whole}, {}, "dp2 x tp4(2d), gemini")
    shapes["ln.bias.grid"] = [2]
    match = r"param of 'ln\.bias\.grid' are absent .* 'dp2 x tp4\(2d\), gemini'.*nothing was"
    with pytest.raises(CheckpointError, match=match):
        _check_whole(shapes, {"param": whole}, {}, "dp2 x tp4(2d), gemini")
