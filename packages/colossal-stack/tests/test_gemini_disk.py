"""Gemini with a disk tier: a host budget smaller than the model's states spills fp32 states and
cold chunks to disk, training matches plain AdamW, and bad disk settings fail in one line before
anything runs or is written."""

from __future__ import annotations

import gc
import hashlib
from pathlib import Path

import pytest
import torch
from _stack_reference import adamw_losses

from colossal import Booster, GeminiPlugin
from colossal.booster import GeminiConfig
from colossal.cli import main
from colossal.train._display import memory_summary
from colossal_contracts import ConfigError
from colossal_models import GPT, GPTConfig

CFG = GPTConfig(vocab_size=256, max_seq_len=32, num_layers=2, num_heads=2, hidden_size=64)
STEPS = 3


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 256, (2, 32), generator=g), torch.randint(0, 256, (2, 32), generator=g)


def test_disk_tier_trains_like_adamw(tmp_path):
    x, y = _batch()
    torch.manual_seed(0)
    ref = GPT(CFG)
    ref_losses = adamw_losses(ref, [(x, y)] * STEPS, 1e-3)
    ref_state = {k: v.detach().clone() for k, v in ref.state_dict().items()}
    del ref  # the warmup counts live CPU tensors: the reference must not be among them
    gc.collect()

    torch.manual_seed(0)
    model = GPT(CFG)
    # most of the accelerator budget is the activation reserve: the room left makes parameter
    # chunks leave within forward and backward (with 1 MiB, since the tied head's chunk is no
    # longer pinned through backward, none does)
    config = GeminiConfig(
        accelerator_bytes=976 << 10, host_bytes=300 << 10, disk_bytes=64 << 20, disk_dir=tmp_path
    )
    plugin = GeminiPlugin(config=config)
    booster = Booster(plugin)
    gm, opt = booster.boost(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    losses, read, faulted, written, unwritten = [], 0, 0, 0, 0
    for _ in range(STEPS):
        loss = gm(x, y)
        booster.backward(loss, opt)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
        stats = plugin.memory_stats()
        assert stats["host_peak_bytes"] <= 300 * 1024 and stats["disk_peak_bytes"] > 0
        read, written = read + stats["disk_read_bytes"], written + stats["disk_written_bytes"]
        faulted += stats["disk_faulted_bytes"]
        unwritten += stats["disk_unwritten_bytes"]
    assert read > 0 and written > 0  # states streamed through memory every step
    assert faulted > 0  # the read-ahead window (72 KiB of 300) holds less than a step streams
    assert unwritten > 0  # parameter chunks evicted back to disk unchanged: not rewritten
    assert losses == pytest.approx(ref_losses, abs=1e-5)
    state = gm.full_state_dict()
    for k, v in ref_state.items():
        torch.testing.assert_close(state[k], v, atol=1e-5, rtol=0)
    (run_dir,) = tmp_path.iterdir()  # one folder of this process under disk_dir
    assert any(p.name.startswith("exp_avg") for p in run_dir.iterdir())
    gm.runtime.manager.close()
    assert not list(tmp_path.iterdir())  # closing removes its files and folder


def test_summary_shows_disk_bytes_read_ahead_and_faulted_in():
    rec = {"bytes_moved": 0, "disk_read_s": 1.0, "disk_write_s": 0.5, "disk_busy_s": 1.5}
    rec |= {
        "disk_read_bytes": 2 << 20,
        "disk_faulted_bytes": 3 << 20,
        "disk_written_bytes": 1 << 20,
        "disk_unwritten_bytes": 1 << 20,
    }
    got = memory_summary([rec, rec])
    assert got["disk read ahead"] == "4 MiB (2 MiB/s)", got
    assert got["disk faulted in (not read ahead)"] == "6 MiB", got
    assert got["disk written"] == "2 MiB (2 MiB/s)", got
    assert got["disk not rewritten (kept on disk)"] == "2 MiB", got
    disk = [k for k in got if k.startswith("disk ")]  # the bytes read from disk side by side
    assert disk == [
        "disk read ahead",
        "disk faulted in (not read ahead)",
        "disk written",
        "disk not rewritten (kept on disk)",
        "disk read + written",
    ], got
    # 2 + 1 MiB per record over 1.5 s with either in flight: each second counted once
    assert got["disk read + written"] == "2 MiB/s over 3.0 s busy", got


def test_plugin_refuses_a_missing_disk_dir(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        GeminiPlugin(config=GeminiConfig(disk_bytes=1 << 30, disk_dir=tmp_path / "missing"))


def _snapshot(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def run(tmp_path_factory):  # type: ignore[no-untyped-def]
    """A previous run's files (the CLI refuses the bad settings before it reads them)."""
    root = tmp_path_factory.mktemp("disk-cli")
    corpus = root / "corpus.txt"
    corpus.write_text("some text to train on\n" * 200)
    out = root / "run"
    (out / "checkpoint" / "step-2").mkdir(parents=True)
    (out / "checkpoint" / "step-2" / "model.safetensors").write_bytes(bytes(range(256)) * 16)
    (out / "checkpoint" / "latest").write_text("step-2\n")
    (out / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    (root / "a-file").write_text("x")
    return {"root": root, "out": out, "corpus": corpus}


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--disk-budget", "1GiB", "--disk-dir", "{root}/missing"], "does not exist"),
        (["--disk-budget", "1GiB", "--disk-dir", "{root}/a-file"], "not a directory"),
        (["--disk-budget", "1000000TiB", "--disk-dir", "{root}"], "larger than the"),
        (["--disk-budget", "lots", "--disk-dir", "{root}"], "cannot read 'lots'"),
        (["--disk-dir", "{root}"], "--disk-dir needs --disk-budget"),
        (["--plugin", "ddp", "--host-budget", "1GiB"], "applies to --plugin gemini only"),
    ],
    ids=["missing", "not-a-dir", "beyond-free-space", "unreadable-size", "dir-alone", "ddp"],
)
def test_cli_bad_disk_settings(run, capsys, extra, message):
    argv = ["train", "--preset", "nano", "--steps", "3", "--batch-size", "2", "--seq-len", "16"]
    argv += ["--out", str(run["out"]), "--resume", "--corpus", str(run["corpus"])]
    argv += [a.format(root=run["root"]) for a in extra]
    before = _snapshot(run["out"])
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and message in err, err
    assert _snapshot(run["out"]) == before  # nothing previously saved is touched


def _train_steps(tmp_path: Path, update: bool | None, steps: int) -> tuple[list, dict, list]:
    """``steps`` of ``booster.train_step`` in 2 micro-batches with a disk tier: the losses, the
    weights, and per step the chunks already updated when the last backward ended."""
    x, y = (torch.cat([t, t.flip(0)]) for t in _batch())
    tmp_path.mkdir()
    torch.manual_seed(0)
    model = GPT(CFG)
    config = GeminiConfig(
        accelerator_bytes=976 << 10, host_bytes=300 << 10, disk_bytes=64 << 20,
        disk_dir=tmp_path, update_in_backward=update,
    )  # fmt: skip
    booster = Booster(GeminiPlugin(config=config))
    gm, opt = booster.boost(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    groups = gm.runtime.manager.groups
    losses, updated = [], []
    for _ in range(steps):
        losses.append(booster.train_step(x, y, gm, opt, microbatches=2))
        updated.append(sum(g.grads.value == "empty" for g in groups.values()))
        opt.step()
        opt.zero_grad()
    state = gm.full_state_dict()
    gm.runtime.manager.close()
    return losses, state, updated


def test_train_step_in_micro_batches_updates_in_the_last_backward(tmp_path):
    # the plugin runs the earlier micro-batch inside optimizer.accumulating(), so automatic
    # update in backward (colossal-zero's [Note: update in backward]) runs in the last one
    fused = _train_steps(tmp_path / "fused", None, 5)
    unfused = _train_steps(tmp_path / "unfused", False, 5)
    assert fused[0] == unfused[0]
    assert all(torch.equal(fused[1][k], unfused[1][k]) for k in unfused[1])
    assert fused[2][-1] > 0 and sum(unfused[2]) == 0
