"""Assertions shared by the 2D / 2.5D / 3D tests on the results their checks return."""

from __future__ import annotations

TOL = 1e-5  # fp32 relative error allowed against the unsharded reference


def assert_layers(per_rank: list[dict], what: str) -> None:
    for rank, res in enumerate(per_rank):
        if what == "config":
            bad = {k: v for k, v in res["errors"].items() if not v.startswith("ok (0 collectives)")}
            assert not bad, f"rank {rank}: {bad}"
            continue
        layers = {k: v for k, v in res.items() if isinstance(v, dict) and "err" in v}
        assert len(layers) >= 6, layers.keys()
        for name, r in layers.items():
            if what == "errors":
                worst = max(r["err"].values())
                assert worst <= TOL, f"rank {rank} {name}: {r['err']}"
            else:
                assert r["bytes"] == r["formula"], (
                    f"rank {rank} {name}: {r['bytes']} vs {r['formula']}"
                )
                assert r["bytes"][0] > 0, f"rank {rank} {name}: nothing counted"
        if what == "errors":
            assert res["roundtrip"] == 0.0


def assert_training(per_rank: list[dict]) -> None:
    for rank, res in enumerate(per_rank):
        ref, par = res["ref"], res["par"]
        assert len(ref) == len(par) == 5
        assert ref[-1] < ref[0], f"the reference did not learn: {ref}"
        for step, (a, b) in enumerate(zip(par, ref)):
            assert abs(a - b) <= TOL * abs(b), f"rank {rank} step {step}: {a} vs {b}"
        assert res["weight_err"] <= 1e-4, f"rank {rank}: trained shards differ {res['weight_err']}"
        assert res["params_local"] < res["params_ref"]
