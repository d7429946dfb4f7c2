"""``mesh_grad_norm``: replicated pieces counted once, split pieces each, overflow seen by all;
its clip factor is the one Gemini and ZeRO divide by."""

from __future__ import annotations

import math

import _checks_mesh_norm as checks
import pytest
import torch

from colossal_contracts import ParamSharding, ShardAxis
from colossal_zero import mesh_grad_norm
from colossal_zero.optim._clip import clip_coef, clip_divisor


def test_replicas_off_coordinate_zero_are_not_counted_but_their_overflow_is():
    other = ShardAxis("tp", None, 2, 1)  # this rank is replica 1 of 2
    rep = ParamSharding(replicated=(other,))
    split = ParamSharding(split=(other,))
    g = torch.full((4,), 2.0)
    assert mesh_grad_norm([(g, rep)]).norm == 0.0
    assert mesh_grad_norm([(g, split), (g, None)]).norm == pytest.approx(math.sqrt(32))
    bad = mesh_grad_norm([(g, split), (torch.tensor([float("nan")]), rep)])
    assert bad.overflow and math.isinf(bad.norm)
    assert not mesh_grad_norm([(g, None)]).overflow


def test_clip_coef_is_what_the_optimizers_divide_by():
    g = torch.full((4,), 2.0)  # norm 4
    coef = mesh_grad_norm([(g, None)]).clip_coef(1.0)
    assert coef == 1.0 / (4.0 + 1e-6) == clip_coef(1.0, 4.0)
    assert clip_divisor(8.0, 1.0, lambda: 4.0) == 8.0 / coef  # loss scale 8, clipped
    assert mesh_grad_norm([(g, None)]).clip_coef(5.0) == 1.0  # within the bound
    assert mesh_grad_norm([(g, None)]).clip_coef(0.0) == 1.0  # 0: no clipping
    bad = mesh_grad_norm([(torch.tensor([float("inf")]), None)])
    assert bad.clip_coef(1.0) == 1.0  # nothing to clip to (was 0.0 in the hybrid plugin's copy)
    assert clip_divisor(1.0, 1.0, lambda: bad.norm) == 1.0


def test_dp2_tp2_every_rank_agrees_and_counts_each_element_once(world):
    out = world(4).run(checks.norm_on_grid)
    expected = math.sqrt(sum(checks.split_value(r) ** 2 * 3 for r in range(4)) + 2 * 5 * 1.5**2)
    assert len({o[0] for o in out}) == 1  # bit-identical on every rank
    assert out[0][0] == pytest.approx(expected, rel=1e-6)  # per-piece norms in fp32
    assert all(o[1] for o in out)  # an inf on one rank's replica: every rank skips
