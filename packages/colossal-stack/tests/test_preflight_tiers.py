"""Issue 35 item 3: the pre-check counts host, disk (and accelerator) budgets ([Note: tier room]),
and bad tier settings are one line each before any file is written."""

from __future__ import annotations

import errno
import json
import math
import shutil
import tempfile
from collections import namedtuple

import pytest

from colossal.cli import main
from colossal.train import TrainConfig, train
from colossal.train._models import resolve_model
from colossal.train._preflight import (
    check_fits,
    check_tiers,
    gemini_host_bytes,
    gemini_state_bytes,
)
from colossal_contracts import ConfigError

HOST = 64 * 2**20  # a 64 MiB host budget
BIG = 1 << 50  # free host memory and RAM, larger than anything asked here


def _tiers(num_params: int, **kw: object) -> int:
    args = dict(num_params=num_params, label="gpt-x", precision="fp32", world=1)
    args.update(host_bytes=HOST, disk_bytes=0, available=BIG, total=BIG)
    args.update(kw)
    return check_tiers(**args)  # type: ignore[arg-type]


def test_a_model_four_times_the_host_budget_fits_when_the_disk_budget_holds_it():
    num_params = 4 * HOST // 16  # fp32 Gemini: 16 bytes per parameter
    assert gemini_state_bytes(num_params, precision="fp32", world=1, local=1) == 4 * HOST
    assert _tiers(num_params, disk_bytes=3 * HOST) == 4 * HOST
    with pytest.raises(ConfigError, match=r"give the disk tier room: --disk-budget 201,326,592"):
        _tiers(num_params)
    with pytest.raises(ConfigError, match="give the disk tier room"):
        _tiers(num_params, disk_bytes=3 * HOST - 1)


def test_bf16_states_take_fourteen_bytes_per_parameter_sharded_over_ranks():
    assert gemini_state_bytes(1000, precision="bf16", world=1, local=1) == 14_000
    assert gemini_state_bytes(1000, precision="bf16", world=2, local=2) == 14_000  # 2 per host


def test_a_host_budget_above_the_ram_is_refused():
    with pytest.raises(ConfigError, match="larger than this machine's RAM"):
        _tiers(10, host_bytes=2 * HOST, total=HOST)


def _cli(tmp_path, capsys, extra: list[str]) -> str:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog. " * 400)
    out = tmp_path / "run"
    argv = ["train", "--preset", "nano", "--steps", "2", "--batch-size", "2", "--seq-len", "16"]
    argv += ["--out", str(out), "--corpus", str(corpus), *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    assert not out.exists()  # nothing written
    return err


def test_cli_host_budget_above_the_ram(tmp_path, capsys):
    err = _cli(tmp_path, capsys, ["--host-budget", "1000000TiB"])
    assert "larger than this machine's RAM" in err


def test_cli_a_model_no_budget_holds(tmp_path, capsys):
    err = _cli(tmp_path, capsys, ["--host-budget", "1KiB", "--disk-budget", "1KiB"])
    assert "give the disk tier room" in err


def test_cli_read_only_disk_dir(tmp_path, capsys, monkeypatch):
    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    # the disk tier's probe (colossal_chunk.check_disk_dir) writes a temporary file there
    monkeypatch.setattr(tempfile, "TemporaryFile", read_only)
    err = _cli(tmp_path, capsys, ["--disk-budget", "1MiB", "--disk-dir", str(tmp_path)])
    assert "not writable (Read-only file system)" in err


def test_cli_disk_dir_on_a_full_filesystem(tmp_path, capsys, monkeypatch):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(1 << 30, 1 << 30, 0))
    err = _cli(tmp_path, capsys, ["--disk-budget", "1MiB", "--disk-dir", str(tmp_path)])
    assert "full filesystem" in err


def test_the_host_share_of_a_model_larger_than_the_ram_passes_check_fits():
    free = 64 * 2**20  # what the host has free
    num_params = 4 * free // 16  # 16 bytes per parameter: four times the free memory
    states = gemini_state_bytes(num_params, precision="fp32", world=1, local=1)
    fits = dict(build=None, label="gpt-x", presets={}, batch_size=1, seq_len=8)
    fits.update(num_params=num_params, sharded=True, world=1, available=free)
    with pytest.raises(ConfigError, match="of host memory for weights"):
        check_fits(**fits)  # the 16 bytes per parameter on the host: refused
    assert gemini_host_bytes(states, disk_bytes=3 * free) == free
    held = gemini_host_bytes(states, disk_bytes=4 * free - free // 8)
    assert held == free // 8 and check_fits(**fits, states=held) == held  # the disk has the rest
    assert gemini_host_bytes(states, disk_bytes=5 * free) == 0


def test_a_model_four_times_the_host_budget_trains_with_a_disk_tier(tmp_path):
    num_params = resolve_model("gpt", "nano", vocab_size=256).num_params
    host = gemini_state_bytes(num_params, precision="fp32", world=1, local=1) // 4
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog. " * 400)
    cfg = TrainConfig.from_flags(
        preset="nano",
        steps=1,
        batch_size=2,
        seq_len=16,
        corpus=corpus,
        out=tmp_path / "run",
        host_budget=host,
        disk_budget=3 * host + 2**20,
        disk_dir=tmp_path,
        export="none",
    )
    result = train(cfg)
    record = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert len(result.losses) == 1 and math.isfinite(result.losses[0])
    assert record["disk_peak_bytes"] > 0 and record["host_peak_bytes"] <= host
