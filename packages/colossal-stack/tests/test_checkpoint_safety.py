"""Nothing completed is lost, nothing corrupt loads silently: publishing, resuming, verifying."""

from __future__ import annotations

import contextlib
import json
import os
import shutil

import pytest
import torch
from _one_step import boosted_one_step, weights

from colossal import Booster, DDPPlugin, GeminiPlugin, latest_checkpoint
from colossal.booster import find_checkpoint
from colossal.checkpoint import _publish
from colossal_contracts import CheckpointError
from colossal_zero import load_sharded
from colossal_zero.checkpoint import INDEX_FILE


class _Killed(BaseException):
    """Stands for a kill -9: nothing after it runs, no cleanup."""


@pytest.mark.parametrize("kill_at", range(6))
def test_resaving_a_step_killed_at_any_point_loses_nothing(tmp_path, monkeypatch, kill_at):
    booster, model, opt = boosted_one_step(seed=0)
    booster.save(model, opt, tmp_path, step=4)
    old = weights(model)
    _, model_b, opt_b = boosted_one_step(seed=1)
    calls = {"n": 0}
    real = {"replace": os.replace, "rmtree": shutil.rmtree}

    def counted(name):  # type: ignore[no-untyped-def]
        def op(*a, **k):  # type: ignore[no-untyped-def]
            if calls["n"] == kill_at:
                raise _Killed
            calls["n"] += 1
            return real[name](*a, **k)

        return op

    monkeypatch.setattr(_publish.os, "replace", counted("replace"))
    monkeypatch.setattr(_publish.shutil, "rmtree", counted("rmtree"))
    with contextlib.suppress(_Killed):
        booster.save(model_b, opt_b, tmp_path, step=4)  # the re-save of a finished run
    monkeypatch.undo()
    found = latest_checkpoint(tmp_path)
    _, fresh, fresh_opt = boosted_one_step(seed=2)
    Booster().load(fresh, fresh_opt, tmp_path)
    got = weights(fresh)
    new = weights(model_b)
    assert all(torch.equal(got[k], old[k]) for k in got) or all(
        torch.equal(got[k], new[k]) for k in got
    ), f"{found} holds neither the old nor the new step 4"
    # the next save finishes or cleans what the kill left: only published steps remain
    booster.save(model_b, opt_b, tmp_path, step=5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step-4", "step-5"]
    assert _publish.is_complete(tmp_path / "step-4")


def test_resave_killed_before_the_pointer_moves_back_resumes_that_step(tmp_path, monkeypatch):
    """Re-saving step 2 while a later step 6 exists (latest moved back, run resumed): a kill
    after the new step-2 is renamed in, before ``latest`` names it, must still find step 2."""
    booster, model, opt = boosted_one_step(seed=0)
    for step in (2, 6):
        booster.save(model, opt, tmp_path, step=step)
    _, model_b, opt_b = boosted_one_step(seed=1)
    real_replace, calls = os.replace, {"n": 0}

    def replace(src, dst):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        real_replace(src, dst)
        if calls["n"] == 2:  # 1: latest -> the new copy; 2: the new copy -> step-2
            raise _Killed

    monkeypatch.setattr(_publish.os, "replace", replace)
    with contextlib.suppress(_Killed):
        booster.save(model_b, opt_b, tmp_path, step=2)
    monkeypatch.undo()
    assert latest_checkpoint(tmp_path).name == "step-2"


def test_orphaned_temp_dirs_are_cleaned_and_complete_ones_published(tmp_path):
    booster, model, opt = boosted_one_step()
    booster.save(model, opt, tmp_path, step=2)
    shutil.copytree(tmp_path / "step-2", tmp_path / ".step-3-abc")  # complete, never renamed in
    (tmp_path / ".step-9-xyz").mkdir()  # a save killed while writing
    (tmp_path / ".step-9-xyz" / "model.safetensors").write_bytes(b"half")
    booster.save(model, opt, tmp_path, step=4)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step-2", "step-3", "step-4"]
    assert latest_checkpoint(tmp_path).name == "step-4"


def test_deleted_latest_finds_the_newest_complete_step(tmp_path):
    booster, model, opt = boosted_one_step()
    for step in (2, 4, 6):
        booster.save(model, opt, tmp_path, step=step)
    (tmp_path / "latest").unlink()
    (tmp_path / "step-6" / _publish.MANIFEST).unlink()  # step 6 is incomplete now
    assert find_checkpoint(tmp_path).name == "step-4"
    (tmp_path / "latest").write_text("step-99\n")  # names nothing
    assert latest_checkpoint(tmp_path).name == "step-4"
    assert Booster().load(*boosted_one_step(seed=3)[1:], tmp_path)["step"] == 4


def test_no_checkpoint_says_how_to_start_fresh(tmp_path):
    with pytest.raises(CheckpointError, match=r"does not exist; start a fresh run .*--restart"):
        latest_checkpoint(tmp_path / "nothing")


def test_swapped_ddp_file_is_named(tmp_path):
    a = Booster().save(*boosted_one_step(seed=0)[1:], tmp_path / "a", step=1)
    b = Booster().save(*boosted_one_step(seed=1)[1:], tmp_path / "b", step=1)
    shutil.copy(b / "optimizer.safetensors", a / "optimizer.safetensors")  # same shapes
    with pytest.raises(CheckpointError, match=r"optimizer\.safetensors does not match"):
        Booster().load(*boosted_one_step(seed=2)[1:], tmp_path / "a")


def test_swapped_gemini_shard_is_named_by_the_index(tmp_path):
    plugin = GeminiPlugin()
    paths = []
    for seed, name in ((0, "a"), (1, "b")):
        booster, model, opt = boosted_one_step(GeminiPlugin(), seed=seed)
        paths.append(booster.save(model, opt, tmp_path / name, step=1))
    shard = next(paths[0].glob("gemini-rank*.safetensors"))
    shutil.copy(paths[1] / shard.name, shard)
    (paths[0] / _publish.MANIFEST).unlink()  # colossal-zero's own check, not the manifest's
    booster, model, opt = boosted_one_step(plugin, seed=2)
    with pytest.raises(CheckpointError, match=f"{shard.name} does not match the checksum"):
        load_sharded(model, opt, paths[0])


@pytest.mark.parametrize(
    "edit,match",
    [
        (lambda d: d.update(step="4"), "no valid 'step'"),
        (lambda d: d.pop("step"), "no valid 'step'"),
        (lambda d: d.update(train_config=[1]), "'train_config' must be an object"),
    ],
)
def test_malformed_trainer_file_is_a_clear_error(tmp_path, edit, match):
    path = Booster().save(*boosted_one_step()[1:], tmp_path, step=1)
    info = json.loads((path / "trainer.json").read_text())
    edit(info)
    (path / "trainer.json").write_text(json.dumps(info))
    _publish._write_manifest(path, 1)  # hashes recomputed: the manifest cannot catch the edit
    with pytest.raises(CheckpointError, match=match):
        Booster().load(*boosted_one_step(seed=1)[1:], tmp_path)


@pytest.mark.parametrize(
    "edit,match",
    [
        (lambda d: d.pop("params"), "'params' must be an object"),
        (lambda d: d.update(world_size="1"), "'world_size' must be a positive int"),
        (lambda d: d.update(params={"x": {"shape": [2], "ranges": 3}}), "entry 'x' needs"),
        (lambda d: d.update(scaler={"scale": "big"}), "'scaler' must be null"),
        (lambda d: d.update(format=7), "unknown format 7"),
    ],
)
def test_malformed_gemini_index_is_a_clear_error(tmp_path, edit, match):
    booster, model, opt = boosted_one_step(GeminiPlugin())
    path = booster.save(model, opt, tmp_path, step=1)
    index = json.loads((path / INDEX_FILE).read_text())
    edit(index)
    (path / INDEX_FILE).write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=match):
        load_sharded(model, opt, path)


def _adam_state(model, opt) -> dict[str, torch.Tensor]:  # type: ignore[no-untyped-def]
    names = {id(p): n for n, p in model.named_parameters()}
    return {
        f"{names[id(p)]}/{k}": v.clone()
        for p, st in opt.state.items()
        for k, v in st.items()
        if isinstance(v, torch.Tensor)
    }


def test_checkpoint_of_another_plugin_loads_whole(tmp_path):
    """[Note: one reader]: DDP's checkpoint into Gemini, and Gemini's (sharded) back into DDP,
    give the first model's weights and Adam state bit for bit."""
    booster, model, opt = boosted_one_step(seed=0)
    booster.save(model, opt, tmp_path / "d", step=1)
    b_gem, m_gem, o_gem = boosted_one_step(GeminiPlugin(), seed=1)
    b_gem.load(m_gem, o_gem, tmp_path / "d")
    b_gem.save(m_gem, o_gem, tmp_path / "g", step=1)
    assert (tmp_path / "g" / "step-1" / INDEX_FILE).is_file()  # Gemini's own format
    b_ddp, m_ddp, o_ddp = boosted_one_step(seed=2)
    b_ddp.load(m_ddp, o_ddp, tmp_path / "g")
    want, got = weights(model), weights(m_ddp)
    assert want.keys() == got.keys() and all(torch.equal(got[k], want[k]) for k in want)
    want, got = _adam_state(model, opt), _adam_state(m_ddp, o_ddp)
    assert len(want) == 3 * len(list(model.parameters()))  # step, exp_avg, exp_avg_sq each
    assert want.keys() == got.keys() and all(torch.equal(got[k], want[k]) for k in want)


def test_checkpoint_of_another_plugin_that_cannot_be_read_is_diagnosed(tmp_path):
    """The plugins' loaders themselves (the Booster's manifest check would name any edit
    first): a DDP checkpoint that does not name its optimizer's parameters, a Gemini shard
    changed after it was written."""
    booster, model, opt = boosted_one_step(seed=0)
    path = booster.save(model, opt, tmp_path / "d", step=1)
    meta = json.loads((path / "meta.json").read_text())
    del meta["param_names"]  # as DDP checkpoints were written before they named them
    (path / "meta.json").write_text(json.dumps(meta))
    b2, m2, o2 = boosted_one_step(GeminiPlugin(), seed=1)
    with pytest.raises(CheckpointError, match=r"does not name the optimizer's.*--plugin ddp"):
        b2.plugin.load_checkpoint(m2, o2, path)
    b3, m3, o3 = boosted_one_step(GeminiPlugin(), seed=1)
    path = b3.save(m3, o3, tmp_path / "g", step=1)
    shard = next(path.glob("gemini-rank*.safetensors"))
    shard.write_bytes(shard.read_bytes()[:-4] + b"\0\0\0\1")  # a changed value, same size
    with pytest.raises(CheckpointError, match=r"does not match the checksum"):
        DDPPlugin().load_checkpoint(*boosted_one_step(seed=2)[1:], path)
