"""``describe_sharding`` reads which tensor-parallel axes split and replicate each parameter."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import _checks_sharding as checks


@pytest.mark.parametrize("mode", ["1d", "2d"])
def test_split_axes_cover_every_parameter_exactly(world, mode):
    out = world(4).run(checks.pieces_cover_each_parameter_once, mode)
    for per_rank in out:
        for name, (covered, full, _) in per_rank.items():
            assert covered == full, name
    first = out[0]
    if mode == "1d":
        assert first["ln_f.weight"][2] == 1  # replicated along tp
        assert first["blocks.0.mlp.fc.weight"][2] == 0  # split along tp
