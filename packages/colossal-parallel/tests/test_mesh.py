"""MeshConfig validation, ProcessMesh layout and groups on worlds of 2, 4 and 8 ranks."""

from __future__ import annotations

import itertools
import math
import sys
from pathlib import Path

import pytest

from colossal_contracts import ConfigError, DistributedError
from colossal_parallel import MeshConfig, ProcessMesh

sys.path.insert(0, str(Path(__file__).parent))
import _checks_parallel_mesh as checks


@pytest.mark.parametrize(
    ("kwargs", "world", "match"),
    [
        ({"tp": 3, "tp_mode": "2d"}, 3, "square"),
        ({"tp": 8, "tp_mode": "2d"}, 8, "square"),
        ({"tp": 8, "tp_mode": "2.5d", "tp_depth": 3}, 8, r"q\*q\*d"),
        ({"tp": 12, "tp_mode": "2.5d", "tp_depth": 2}, 12, r"q\*q\*d"),
        ({"tp": 4, "tp_mode": "3d"}, 4, "cube"),
        ({"tp": 9, "tp_mode": "3d"}, 9, "cube"),
        ({"tp": 4, "tp_mode": "2d", "tp_depth": 2}, 4, "only applies"),
        ({"dp": 2, "tp": 2}, 8, "world size 8"),
        ({"dp": 2, "pp": 2, "tp": 4, "tp_mode": "2d"}, 8, "2\\*2\\*1\\*4 = 16"),
        ({"dp": 2, "sp": 2}, 2, "world size 2"),
    ],
)
def test_validate_rejects_bad_shapes(kwargs, world, match):
    cfg = MeshConfig(**kwargs)
    with pytest.raises(ConfigError, match=match):
        cfg.validate(world)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"tp": 0},
        {"dp": -1},
        {"pp": 1.5},
        {"tp": True},
        {"tp_mode": "4d"},
        {"tp_depth": 0},
        {"sp": 0},
    ],
)
def test_construction_rejects_bad_values(kwargs):
    with pytest.raises(ConfigError, match="MeshConfig"):
        MeshConfig(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "shape", "axes"),
    [
        ({"tp": 4}, (4,), ("pp", "dp", "sp", "tp")),
        ({"tp": 4, "tp_mode": "2d"}, (2, 2), ("pp", "dp", "sp", "tp_row", "tp_col", "tp")),
        (
            {"tp": 8, "tp_mode": "2.5d", "tp_depth": 2},
            (2, 2, 2),
            ("pp", "dp", "sp", "tp_dep", "tp_row", "tp_col", "tp"),
        ),
        (
            {"tp": 18, "tp_mode": "2.5d", "tp_depth": 2},
            (2, 3, 3),
            ("pp", "dp", "sp", "tp_dep", "tp_row", "tp_col", "tp"),
        ),
        (
            {"tp": 27, "tp_mode": "3d"},
            (3, 3, 3),
            ("pp", "dp", "sp", "tp_in", "tp_wt", "tp_out", "tp"),
        ),
    ],
)
def test_valid_shapes(kwargs, shape, axes):
    cfg = MeshConfig(**kwargs)
    cfg.validate(cfg.world_size)
    assert cfg.tp_shape == shape
    assert cfg.axes == axes


def test_mesh_needs_initialised_distributed():
    with pytest.raises(DistributedError, match="init"):
        ProcessMesh(MeshConfig())


def _expected(cfg: MeshConfig, rank: int) -> dict[str, tuple[int, list[int]]]:
    """Independent reference: enumerate all coordinates, row-major over (pp, dp, sp, *tp_axes)."""
    names = ("pp", "dp", "sp", *cfg.tp_layout)
    shape = (cfg.pp, cfg.dp, cfg.sp, *cfg.tp_shape)
    grid = list(itertools.product(*(range(s) for s in shape)))  # index == global rank
    mine = grid[rank]
    out = {}
    for i, name in enumerate(names):
        members = [
            g
            for g, co in enumerate(grid)
            if all(co[j] == mine[j] for j in range(len(shape)) if j != i)
        ]
        out[name] = (mine[i], members)
    if cfg.tp_mode != "1d":
        members = [g for g, co in enumerate(grid) if co[:3] == mine[:3]]
        out["tp"] = (members.index(rank), members)
    if cfg.sp > 1:  # dp and sp flattened: same pp and tp coordinates
        members = [g for g, co in enumerate(grid) if co[0] == mine[0] and co[3:] == mine[3:]]
        out["dp_sp"] = (members.index(rank), members)
    return out


CASES = [
    (2, MeshConfig(tp=2)),
    (2, MeshConfig(dp=2)),
    (4, MeshConfig(dp=2, tp=2)),
    (4, MeshConfig(pp=2, tp=2)),
    (4, MeshConfig(tp=4, tp_mode="2d")),
    (8, MeshConfig(dp=2, tp=4, tp_mode="2d")),
    (8, MeshConfig(tp=8, tp_mode="2.5d", tp_depth=2)),
    (8, MeshConfig(tp=8, tp_mode="3d")),
    (8, MeshConfig(dp=2, pp=2, tp=2)),
    (4, MeshConfig(dp=2, sp=2)),
    (8, MeshConfig(pp=2, sp=2, tp=2)),
]


@pytest.mark.parametrize(("n", "cfg"), CASES, ids=[f"{n}-{c}" for n, c in CASES])
def test_mesh_layout_and_groups(world, n, cfg):
    results = world(n).run(checks.describe_mesh, cfg)
    for rank, res in enumerate(results):
        assert res["rank"] == rank and res["world_size"] == n
        for axis, (coord, members) in _expected(cfg, rank).items():
            got = res[axis]
            assert got["coord"] == coord, (rank, axis)
            assert got["ranks"] == members, (rank, axis)
            assert got["size"] == len(members)
            assert got["group_rank"] == coord  # group rank order == coordinate order
            assert got["gathered"] == members  # the group really holds those ranks
    # axis sizes multiply to the world (tp counted once)
    layout = ("pp", "dp", "sp", *cfg.tp_layout)
    assert math.prod(results[0][a]["size"] for a in layout) == n


def test_2d_row_and_col_groups(world):
    """(row i, col j) holds block A[i, j]: tp_row = same i, varying j; tp_col = same j."""
    results = world(4).run(checks.describe_mesh, MeshConfig(tp=4, tp_mode="2d"))
    for rank, res in enumerate(results):
        i, j = divmod(rank, 2)
        assert (res["tp_col"]["coord"], res["tp_row"]["coord"]) == (i, j)
        assert res["tp_col"]["ranks"] == [0 * 2 + j, 1 * 2 + j]  # varying row i
        assert res["tp_row"]["ranks"] == [i * 2 + 0, i * 2 + 1]  # varying col j


def test_2p5d_depth_layers(world):
    """2.5D: rank = dep*q*q + i*q + j; each depth layer is a 2D grid; tp_dep varies the layer."""
    results = world(8).run(checks.describe_mesh, MeshConfig(tp=8, tp_mode="2.5d", tp_depth=2))
    for rank, res in enumerate(results):
        k, rem = divmod(rank, 4)
        i, j = divmod(rem, 2)
        assert (res["tp_dep"]["coord"], res["tp_col"]["coord"], res["tp_row"]["coord"]) == (k, i, j)
        assert res["tp_row"]["ranks"] == [k * 4 + i * 2 + jj for jj in range(2)]
        assert res["tp_col"]["ranks"] == [k * 4 + ii * 2 + j for ii in range(2)]
        assert res["tp_dep"]["ranks"] == [kk * 4 + i * 2 + j for kk in range(2)]
        assert res["tp"]["ranks"] == list(range(8)) and res["tp"]["coord"] == rank


@pytest.mark.parametrize(
    "cfg",
    [MeshConfig(tp=4, tp_mode="2d"), MeshConfig(tp=4), MeshConfig(tp=2, tp_mode="3d")],
)
def test_bad_size_raises_before_any_collective(world, cfg):
    results = world(2).run(checks.bad_config_then_collective, cfg)
    for res in results:
        count, msg = res.split("|", 1)
        assert count == "2"  # the world's next collective still completes on every rank
        assert msg, "ProcessMesh accepted an invalid config"


def test_meshes_of_one_world_share_their_groups(world):
    """[Note: shared groups] on 4 ranks. ``dp2 tp2`` asks for 12 groups: pp and sp, the four
    singletons each; dp {0, 2}, {1, 3}; tp {0, 1}, {2, 3}: 8 rank sets created, 4 reused.
    ``dp2 pp2`` then asks for pp {0, 2}, {1, 3}, dp {0, 1}, {2, 3} and the singletons for sp
    and tp: all 12 reused, none created."""
    for rank, res in enumerate(world(4).run(checks.shared_groups_across_meshes)):
        a, b, c = res["after_a"], res["after_b"], res["after_c"]
        assert (a.created, a.reused, a.live) == (8, 4, 8)
        assert (b.created, b.reused, b.live) == (8, 16, 8)
        assert res["shared"]  # the same group objects, not equal copies
        assert res["pp_sum"] == 2.0  # a closed, its groups still work for b
        assert res["destroyed"] == 3  # this rank's singleton and its two pairs
        assert (c.created, c.reused, c.live) == (8, 4, 8)  # counted afresh after the release
        assert res["tp_sum"] == (1.0 if rank < 2 else 5.0)
