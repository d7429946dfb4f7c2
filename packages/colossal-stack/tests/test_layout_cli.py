"""``--layout`` and hardware profiles: the plan table's strings read back, and bad input (a
layout that does not read or build, ``auto`` with nothing fitting, a missing or corrupt profile)
is one line with nothing written."""

from __future__ import annotations

import json

import pytest

from colossal.cli import main
from colossal.plan import model_shape
from colossal.plan._calibrate import calibrate, load_profile, profile_hardware
from colossal.plan._layout import enumerate_layouts, parse_layout
from colossal_contracts import ConfigError


def test_every_printed_layout_reads_back():
    shape = model_shape("gpt", "175b")
    lays = list(
        enumerate_layouts(64, layers=shape.layers, heads=shape.heads, seq_len=2048, global_batch=64)
    )
    assert len(lays) > 100
    for lay in lays:
        assert parse_layout(lay.describe()) == lay


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--layout", "dp2 tp3x zero1 mb1x1"], "cannot read 'tp3x'"),
        (["--layout", "dp2 zero1"], "has no mb part"),
        (["--layout", "dp1 pp2 gemini mb2x2", "--batch-size", "4"], "does not build"),
        (["--layout", "dp1 tp4-2d ring2 zero1 mb4x1", "--batch-size", "4"], "nearest that builds"),
        (["--layout", "dp2 zero1 mb2x1", "--batch-size", "4"], "uses 2 ranks, the run has 1"),
        (["--layout", "dp1 zero1 mb2x1", "--batch-size", "4"], "use --batch-size 2"),
        (["--layout", "auto", "--accelerator-budget", "1KiB"], "smallest device budget"),
        (["--layout", "auto", "--tp", "2"], "--tp comes from --layout"),
        (["--layout", "auto", "--hardware-profile", "missing.json"], "does not exist"),
    ],
)
def test_bad_layout_is_one_line_and_writes_nothing(tmp_path, capsys, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WORLD_SIZE", "1")
    out = tmp_path / "run"
    code = main(["train", "--preset", "nano", "--seq-len", "32", "--out", str(out), *argv])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error: ") and len(err.splitlines()) == 1, err
    assert message in err and not out.exists()


def test_profile_round_trip_and_corrupt_profiles(tmp_path, capsys):
    prof = calibrate(tokens=64, hidden=32, disk_dir=tmp_path, quick=True)
    assert all(v > 0 for v in prof["flops"].values()) and prof["disk_read_bw"] > 0
    path = tmp_path / "p.json"
    path.write_text(json.dumps(prof))
    hw = profile_hardware(load_profile(path), precision="fp32", name="p")
    assert hw.peak_flops == prof["flops"]["fp32"] and hw.memory == prof["memory"]
    for text, message in (("{", "not readable JSON"), ('{"flops": {}}', "lacks")):
        path.write_text(text)
        with pytest.raises(ConfigError, match=message):
            load_profile(path)
        code = main(["plan", "--preset", "nano", "--hardware-profile", str(path)])
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1 and message in err
