"""Rank-side half of test_layouts_build.py's ``--layout auto`` run (the one-step build of each
layout is ``one_step_each`` in ``benchmarks/_layouts_runs.py``, shared with the benchmark)."""

from __future__ import annotations

import os
from typing import Any

import torch

from colossal import TrainConfig, train
from colossal.train._layout import apply_layout


def train_auto(kw: dict[str, Any]) -> dict[str, Any]:
    """``colossal train --layout auto`` on this world (as the CLI does it)."""
    os.environ["WORLD_SIZE"] = str(torch.distributed.get_world_size())
    os.environ["RANK"] = str(torch.distributed.get_rank())
    result = train(TrainConfig.from_flags(**apply_layout("auto", kw)))
    return {"losses": result.losses}
