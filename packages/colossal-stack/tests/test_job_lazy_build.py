"""Issue 35 item 3: ``colossal train`` builds its model lazily ([Note: lazy job]) under Gemini
(with and without tp), ZeRO and the hybrid plugin (with pipeline stages), and the run is the eager
build's bit for bit: the weights right after setup and the losses of two steps."""

from __future__ import annotations

import pytest
import torch
from _checks_job_lazy import lazy_and_eager

RUNS_1 = {  # one process
    "gemini": {"plugin": "gemini", "host_budget": "64MiB"},
    "zero2": {"plugin": "zero", "zero": 2},
    "hybrid": {"plugin": "hybrid", "zero": 1},
}
RUNS_2 = {  # two ranks, one shared world
    "gemini-tp2": {"plugin": "gemini", "tp": 2},
    "hybrid-pp2": {"plugin": "hybrid", "pp": 2, "microbatches": 2},
}


def _check(out: dict) -> None:
    lazy, eager = out["lazy"], out["eager"]
    assert lazy["meta"] and not eager["meta"]  # the plugin got a meta model, or a built one
    assert lazy["weights"].keys() == eager["weights"].keys()
    for k, v in eager["weights"].items():
        assert torch.equal(lazy["weights"][k], v), k
    assert len(lazy["losses"]) == 2 and lazy["losses"] == eager["losses"]


@pytest.mark.parametrize("name", list(RUNS_1))
def test_the_job_builds_lazily_and_equals_the_eager_build(tmp_path, name):
    _check(lazy_and_eager({name: RUNS_1[name]}, str(tmp_path))[name])


def test_multi_rank_jobs_build_lazily_and_equal_the_eager_build(world, tmp_path):
    for rank_out in world(2).run(lazy_and_eager, RUNS_2, str(tmp_path)):
        for name in RUNS_2:
            _check(rank_out[name])
