"""The rows of ``bench_movement`` with activations in the budget: Belady with the per-moment room
left against the auto policy told the same figures (per moment or as one reserve, with and
without dropping unchanged chunks), and the savings the report draws from them."""

from __future__ import annotations

from _movement_trace import ITERATIONS, _steady

from colossal_chunk import AutoPolicy, OrderStats
from colossal_chunk.policies import simulate, simulate_policy
from colossal_contracts import CapacityError

CLEAN = ", unchanged chunks dropped (modelled)"  # [Note: clean evictions] in colossal-chunk


def _clean_savings(rows: list[dict], suffix: str) -> str:
    """Per configuration: per-moment's saving over the single reserve when unchanged chunks are
    dropped, and what dropping them saves per-moment planning itself."""
    out = []
    for r in rows:
        if r["policy"] != f"auto, single reserve, with activations{suffix}{CLEAN}":
            continue
        same = {
            x["policy"]: x.get("MiB_per_iter")
            for x in rows
            if (x["preset"], x["budget"]) == (r["preset"], r["budget"])
        }
        per, copied = (
            same[f"auto, with activations{suffix}{CLEAN}"],
            same[f"auto, with activations{suffix}"],
        )
        if r["MiB_per_iter"] and copied:
            out.append(
                f"{r['preset']}/{r['budget']} {100 * (1 - per / r['MiB_per_iter']):.1f}%; "
                f"{100 * (1 - per / copied):.1f}%"
            )
    return ", ".join(out) or "n/a"


def _savings(rows: list[dict], suffix: str) -> list[tuple[str, float, float, float]]:
    """Per configuration where either plan moves bytes: (preset/budget, auto's saving, the
    optimum's saving, the ceiling), each as 1 - per-moment bytes / single-reserve bytes. The
    ceiling puts the optimum with no activations at all in place of per-moment's bytes."""
    free = "belady (optimum)" + (f", no activations{suffix}" if suffix else "")
    out = []
    for r in rows:
        if r["policy"] != f"auto, single reserve, with activations{suffix}" or not r.get(
            "MiB_per_iter"
        ):
            continue  # both move nothing: no saving to measure
        same = {
            x["policy"]: x["MiB_per_iter"]
            for x in rows
            if (x["preset"], x["budget"]) == (r["preset"], r["budget"]) and "MiB_per_iter" in x
        }
        opt_flat = same[f"belady (optimum), single reserve, with activations{suffix}"]
        out.append(
            (
                f"{r['preset']}/{r['budget']}",
                1 - same[f"auto, with activations{suffix}"] / r["MiB_per_iter"],
                1 - same[f"belady (optimum), with activations{suffix}"] / opt_flat,
                1 - same[free] / r["MiB_per_iter"],
            )
        )
    return out


def _with_activations(
    report, base, worst, steps, sizes, cap, act, written, suffix: str = ""
) -> None:
    """Rows where non-model data (activations) takes part of the budget at each step: Belady
    with the per-step room left, against auto told the same figures through a MemStatsSource."""
    room = [cap - a for a in act]
    if any(sum(sizes[c] for c in st) > r for st, r in zip(steps, room)):
        report.rows.append({**base, "policy": f"with activations{suffix}: infeasible"})
        return
    opt = _steady(simulate(steps, sizes, room, iterations=ITERATIONS).per_iteration)
    report.rows.append(
        {
            **base,
            "policy": f"belady (optimum), with activations{suffix}",
            "MiB_per_iter": opt / 2**20,
            "x_optimum": 1.0,
        }
    )
    if suffix:  # the plain rows' optimum is the states trace's; this trace needs its own
        free = _steady(simulate(steps, sizes, cap, iterations=ITERATIONS).per_iteration)
        report.rows.append(
            {**base, "policy": f"belady (optimum), no activations{suffix}",
             "MiB_per_iter": free / 2**20, "x_optimum": free / opt if opt else 1.0}
        )  # fmt: skip
    flat = [cap - max(act)] * len(steps)  # the single reserve's room at every moment
    opt_flat = _steady(simulate(steps, sizes, flat, iterations=ITERATIONS).per_iteration)
    report.rows.append(
        {
            **base,
            "policy": f"belady (optimum), single reserve, with activations{suffix}",
            "MiB_per_iter": opt_flat / 2**20,
            "x_optimum": opt_flat / opt if opt else 1.0,
        }
    )
    stats = OrderStats([()] * len(steps), act)  # a MemStatsSource with the non-model peaks
    single = OrderStats([()] * len(steps), [max(act)] * len(steps))  # one constant reserve
    for label, pf, st, w in (
        (f"auto, with activations{suffix}", 0, stats, None),
        (f"auto+prefetch, with activations{suffix}", 1, stats, None),
        (f"auto, single reserve, with activations{suffix}", 0, single, None),
        (f"auto, with activations{suffix}{CLEAN}", 0, stats, written),
        (f"auto, single reserve, with activations{suffix}{CLEAN}", 0, single, written),
    ):
        pol = AutoPolicy(st, lookahead=1)
        pol.set_schedule(steps)
        try:
            res = simulate_policy(
                pol, steps, sizes, cap, iterations=ITERATIONS, prefetch=pf, written=w
            )
        except CapacityError:
            report.rows.append({**base, "policy": f"{label}: CapacityError (reserve too big)"})
            worst[label] = float("inf")
            continue
        per = _steady(res.per_iteration)
        worst[label] = max(worst.get(label, 0.0), per / opt if opt else 1.0)
        report.rows.append(
            {
                **base,
                "policy": label,
                "MiB_per_iter": per / 2**20,
                "x_optimum": per / opt if opt else 1.0,
                "prefetched_pct": 100 * res.prefetched_loads / max(res.loads, 1),
            }
        )
