"""The ``box_capacity`` benchmark's model sizes (``benchmarks/_box_capacity_job.py``): the
parameter count it searches with equals the GPT-2 that ``colossal train --model hf:PATH`` builds
from its config and the one ``colossal plan`` counts; and its per-step disk figures are the step
records' sums."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from colossal.plan import model_shape

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
from _box_capacity_job import disk_rates, gpt2_config, gpt2_params


@pytest.mark.parametrize(("layers", "width", "seq"), [(1, 64, 16), (3, 128, 32)])
def test_gpt2_params_equal_the_built_and_the_planned_model(tmp_path, layers, width, seq):
    path = gpt2_config(tmp_path, layers=layers, width=width, seq_len=seq)
    with torch.device("meta"):
        model = GPT2LMHeadModel(GPT2Config.from_json_file(path))
    built = sum(p.numel() for p in model.parameters())  # tied: the head is the embedding
    assert gpt2_params(layers, width, seq) == built
    assert model_shape(f"hf:{path}", "").params == built


def test_disk_rates_leave_out_the_first_step():
    recs = [
        {"step_time_s": 9.0, "disk_read_bytes": 0, "disk_faulted_bytes": 2**30,
         "disk_written_bytes": 2**30, "disk_read_s": 0.0, "disk_write_s": 1.0, "disk_busy_s": 1.0},
        {"step_time_s": 2.0, "disk_read_bytes": 2**21, "disk_faulted_bytes": 2**21,
         "disk_written_bytes": 2**22, "disk_read_s": 0.5, "disk_write_s": 2.0, "disk_busy_s": 2.0},
    ]  # fmt: skip
    r = disk_rates(recs)
    assert r["step_s"] == 2.0
    assert r["disk_read_MiB_per_step"] == 4.0
    assert r["disk_written_MiB_per_step"] == 4.0
    assert r["tier_read_MiB_s"] == 4.0 and r["tier_write_MiB_s"] == 2.0 and r["tier_MiB_s"] == 4.0
