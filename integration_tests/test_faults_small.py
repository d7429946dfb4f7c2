"""The fault suite, small (``python benchmarks/run.py faults`` runs 20 trials of each): kill -9
at a random moment while ``colossal train`` saves, and while it re-saves steps that already
exist; no completed checkpoint may be lost and ``--resume`` must work afterwards."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_faults


@pytest.mark.slow
@pytest.mark.parametrize("resave", [False, True], ids=["save", "re-save"])
def test_kill_during_saves_loses_nothing(tmp_path, resave):
    corpus = bench_faults._corpus(tmp_path)
    result = bench_faults.save_kill_trial(tmp_path, corpus, random.Random(7), resave=resave)
    assert result["lost"] == 0, result
    assert result["resume_ok"], result
    assert result["unpublished_after_resume"] == 0, result
