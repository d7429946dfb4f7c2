"""MemStats: the contract, persistence, errors."""

import json

import pytest

from colossal_contracts import ConfigError, MemStatsSource, TierName
from colossal_memtrace import MemStats
from colossal_memtrace._stats import Moment, StepSummary


def _stats() -> MemStats:
    moments = tuple(
        Moment(
            i,
            f"fwd:l{i}",
            "forward",
            (f"l{i}.weight",),
            {"accelerator": 100, "host": 7},
            {"accelerator": 10 * (i + 1)},
            {"accelerator": 100 + 10 * (i + 1)},
        )
        for i in range(3)
    )
    step = StepSummary(0, 3, {"accelerator": 130}, {"accelerator": 30}, {"accelerator": 100})
    return MemStats(moments, (step,), device="cpu", extra={"model": "x"})


def test_satisfies_the_contract():
    s = _stats()
    assert isinstance(s, MemStatsSource)
    assert s.num_moments() == 3
    assert s.non_model_peak(2, TierName.ACCELERATOR) == 30
    assert s.non_model_peak(2, "accelerator") == 30
    assert s.non_model_peak(1, "host") == 0  # nothing seen there
    assert s.non_model_peak(1, "disk") == 0
    assert list(s.compute_order()) == [("l0.weight",), ("l1.weight",), ("l2.weight",)]
    assert s.first_use() == {"l0.weight": 0, "l1.weight": 1, "l2.weight": 2}
    assert s.peak_bytes() == 130 and s.peak_non_model() == 30
    assert s.summary()["model_bytes_end"] == 100


def test_bad_moment_or_tier_say_what_to_do():
    s = _stats()
    with pytest.raises(ConfigError, match=r"out of range.*3 moments"):
        s.non_model_peak(3, "accelerator")
    with pytest.raises(ConfigError, match="unknown memory tier 'gpu'"):
        s.non_model_peak(0, "gpu")


def test_json_round_trip(tmp_path):
    s = _stats()
    path = s.save(tmp_path / "sub" / "stats.json")
    back = MemStats.load(path)
    assert back == s
    assert json.loads(path.read_text())["format_version"] == 1


def test_load_rejects_other_files(tmp_path):
    p = tmp_path / "x.json"
    p.write_text(json.dumps({"moments": []}))
    with pytest.raises(ConfigError, match="format_version"):
        MemStats.load(p)
    p.write_text("not json")
    with pytest.raises(ConfigError, match="cannot read MemStats"):
        MemStats.load(p)
    p.write_text(json.dumps({"format_version": 1, "moments": [{"index": 0}]}))
    with pytest.raises(ConfigError, match="malformed"):
        MemStats.load(p)
