"""The fault suite, small (``python benchmarks/run.py faults`` runs many trials of each): kill -9
at a random moment while ``colossal train`` saves, and while it re-saves steps that already
exist (no completed checkpoint may be lost and ``--resume`` must work afterwards); two runs into
one ``--out``; a killed launcher; a frozen rank; a clean two-rank run's exit."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import _faults_runs as runs
import bench_faults


@pytest.mark.slow
@pytest.mark.parametrize("resave", [False, True], ids=["save", "re-save"])
def test_kill_during_saves_loses_nothing(tmp_path, resave):
    corpus = bench_faults._corpus(tmp_path)
    result = bench_faults.save_kill_trial(tmp_path, corpus, random.Random(7), resave=resave)
    assert result["lost"] == 0, result
    assert result["resume_ok"], result
    assert result["unpublished_after_resume"] == 0, result


@pytest.mark.slow
@pytest.mark.parametrize("k", [0, 1], ids=["together", "resume-while-running"])
def test_two_runs_into_one_out_never_mix(tmp_path, k):
    result = runs.concurrent_trial(tmp_path, bench_faults._corpus(tmp_path), k)
    assert result["torn"] == 0 and result["mixed"] == 0, result
    assert 2 in result["exit"], result  # one of the two was refused, in one line
    assert result["refused_with_pid"] or k == 0, result  # a resume while it runs: its pid
    assert result["tracebacks"] == 0, result


@pytest.mark.slow
def test_killed_launcher_leaves_no_rank(tmp_path):
    result = runs.launcher_kill_trial(tmp_path, bench_faults._corpus(tmp_path))
    assert result["ranks"] == 2 and result["surviving"] == 0 and result["lock_free"], result


@pytest.mark.slow
def test_frozen_rank_stops_the_job_naming_it(tmp_path):
    # a 10 s limit (COLOSSAL_HEARTBEAT_TIMEOUT) instead of the default 30 s: the same path, sooner
    result = runs.frozen_trial(tmp_path, bench_faults._corpus(tmp_path), "ddp", 10)
    assert result["names_rank_1"] and not result["tracebacks"], result
    assert "no heartbeat for 10 s" in result["said"], result
    assert result["stop_s"] != float("inf"), result  # a guard: the job ended by itself


@pytest.mark.slow
def test_clean_two_rank_gemini_run_exits_cleanly(tmp_path):
    result = runs.clean_trial(tmp_path, bench_faults._corpus(tmp_path), 2, ["--plugin", "gemini"])
    assert result["rc"] == 0 and result["aborts"] == 0 and not result["tracebacks"], result


@pytest.mark.slow
def test_sigint_to_the_launcher_stops_every_rank_in_one_line(tmp_path):
    result = runs.sigint_trial(tmp_path, bench_faults._corpus(tmp_path))
    assert result["rc"] == 130 and result["surviving"] == 0, result
    assert result["last"].startswith("error: colossal run: stopped by SIGINT"), result
    assert result["kept"] >= 1 and not result["tracebacks"], result
