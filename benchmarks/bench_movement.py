"""Bytes moved per training iteration by chunk placement policies, against Belady's optimum.

For GPT presets (byte-level vocabulary), parameters are packed in traced first-use order into chunks
(size from ``search_chunk_size``); optimizer-state chunks (fp32 master, Adam m and v) share their
layout. Gradients live in the parameter chunk's own slots, as Gemini's runtime keeps them with fp32
masters ([Note: gradients in chunks] in colossal-zero). One iteration's access trace is: forward
moments use parameter chunks, backward moments use them again (reverse order; gradients are
written into them), and the optimizer step uses every chunk group once. Each policy replays the same trace under accelerator budgets of 25%, 50% and 75% of all
model states; bytes moved (in + out) per steady-state iteration are divided by Belady's MIN.
"""

from __future__ import annotations

import time
from pathlib import Path

from _movement_activations import CLEAN, _clean_savings, _savings, _with_activations
from _movement_trace import (
    ACT_BATCH,
    ACT_SEQ,
    ITERATIONS,
    _activations,
    _layout,
    _manager_replay,
    _steady,
    _trace,
    _written,
)

from colossal_chunk import AutoPolicy, StaticPolicy
from colossal_chunk.policies import (
    ChunkSummary,
    LruPolicy,
    PolicyContext,
    simulate,
    simulate_policy,
)

from _report import Report

FRACTIONS = (0.25, 0.5, 0.75)
HYBRID = ", hybrid Adam"  # rows whose optimizer step updates states where they live


def run(quick: bool, out_dir: Path) -> Report:
    presets = ("micro", "tiny") if quick else ("small", "medium")
    replay_preset = "micro" if quick else "tiny"
    cols = [
        "preset",
        "params_M",
        "budget",
        "budget_MiB",
        "chunk_MiB",
        "waste_pct",
        "policy",
        "MiB_per_iter",
        "x_optimum",
        "prefetched_pct",
    ]
    report = Report("movement", "Chunk bytes moved per iteration vs Belady's optimum", cols)
    worst = {
        "static": 0.0,
        "auto": 0.0,
        "auto+prefetch": 0.0,
        "lru": 0.0,
        "auto, with activations": 0.0,
        "auto+prefetch, with activations": 0.0,
        "auto, single reserve, with activations": 0.0,
    }
    waste = {}
    for preset in dict.fromkeys((*presets, replay_preset)):
        replay_only = preset not in presets
        t0 = time.perf_counter()
        cfg, order, names, numel = _trace(preset)
        found, kinds, sizes, steps = _layout(order, names, numel)
        total = sum(sizes)
        waste[preset] = found.waste
        ctx = tuple(ChunkSummary(i, k, s) for i, (k, s) in enumerate(zip(kinds, sizes)))
        working = max(sum(sizes[c] for c in st) for st in steps)
        for frac in FRACTIONS:
            cap = int(total * frac)
            base = {
                "preset": preset,
                "params_M": round(sum(numel.values()) / 1e6, 2),
                "budget": f"{int(frac * 100)}%",
                "budget_MiB": cap / 2**20,
                "chunk_MiB": found.chunk_numel * 2 / 2**20,
                "waste_pct": 100 * found.waste,
            }
            if working > cap:
                report.rows.append({**base, "policy": "infeasible: one step exceeds the budget"})
                continue
            opt = _steady(simulate(steps, sizes, cap, iterations=ITERATIONS).per_iteration)
            context = PolicyContext(ctx, {}, cap)
            results = {}
            if not replay_only:
                results["static"] = simulate_policy(
                    StaticPolicy.fitting(context, working),
                    steps,
                    sizes,
                    cap,
                    iterations=ITERATIONS,
                    context=context,
                )
                results["lru"] = simulate_policy(
                    LruPolicy(), steps, sizes, cap, iterations=ITERATIONS, context=context
                )
                warm = AutoPolicy()  # no trace yet: LRU with a conservative share
                warm_res = simulate_policy(warm, steps, sizes, cap, iterations=1, context=context)
                for label, pf in (("auto", 0), ("auto+prefetch", 1)):
                    pol = AutoPolicy()
                    pol.set_schedule(steps)
                    results[label] = simulate_policy(
                        pol, steps, sizes, cap, iterations=ITERATIONS, prefetch=pf, context=context
                    )
            report.rows.append(
                {
                    **base,
                    "policy": "belady (optimum)",
                    "MiB_per_iter": opt / 2**20,
                    "x_optimum": 1.0,
                }
            )
            for label, res in results.items():
                per = _steady(res.per_iteration)
                ratio = per / opt if opt else 1.0
                worst[label] = max(worst[label], ratio)
                report.rows.append(
                    {
                        **base,
                        "policy": label,
                        "MiB_per_iter": per / 2**20,
                        "x_optimum": ratio,
                        "prefetched_pct": 100 * res.prefetched_loads / max(res.loads, 1),
                    }
                )
            if not replay_only:
                per = warm_res.per_iteration[0]
                cold = simulate(steps, sizes, cap).per_iteration[0]
                report.rows.append(
                    {
                        **base,
                        "policy": "auto, warmup iteration (cold)",
                        "MiB_per_iter": per / 2**20,
                        "x_optimum": per / cold,
                    }
                )
            if not replay_only:
                _with_activations(
                    report,
                    base,
                    worst,
                    steps,
                    sizes,
                    cap,
                    _activations(cfg, len(order), len(steps)),
                    _written(steps, len(order)),
                )
                hybrid = steps[: len(order)]  # the optimizer updates states where they live
                _with_activations(
                    report,
                    base,
                    worst,
                    hybrid,
                    sizes,
                    cap,
                    _activations(cfg, len(order), len(hybrid)),
                    _written(hybrid, len(order)),
                    suffix=HYBRID,
                )
            if preset == replay_preset:
                measured = _manager_replay(kinds, sizes, steps, found.chunk_numel, cap, steps)
                report.rows.append(
                    {
                        **base,
                        "policy": "auto, real ChunkManager (measured)",
                        "MiB_per_iter": measured / 2**20,
                        "x_optimum": measured / opt if opt else 1.0,
                    }
                )
        report.notes.append(
            f"{preset}: {len(steps)} steps per iteration, "
            f"{kinds.count('param')} parameter chunks of {found.chunk_numel:,} "
            f"elements, traced and simulated in {time.perf_counter() - t0:.1f}s."
        )
    report.summary = {}
    for suffix, label in (("", "states to the accelerator"), (HYBRID, "hybrid Adam")):
        got = _savings(report.rows, suffix)
        report.summary[f"per-moment vs single reserve, {label}: auto (optimum; ceiling)"] = (
            ", ".join(f"{k} {100 * v:.1f}% ({100 * o:.1f}%; {100 * c:.1f}%)" for k, v, o, c in got)
            or "n/a"
        )
        vals = [v for _, v, _, _ in got]
        report.summary[f"per-moment vs single reserve, {label}: fewer bytes moved (mean, min)"] = (
            f"{100 * sum(vals) / len(vals):.1f}%, {100 * min(vals):.1f}%" if vals else "n/a"
        )
        report.summary[f"configurations with >= 20% fewer bytes, {label}"] = (
            ", ".join(f"{k} ({100 * v:.1f}%)" for k, v, _, _ in got if v >= 0.2) or "none"
        )
        report.summary[f"configurations where either moves bytes, {label}"] = len(got)
        report.summary[f"unchanged chunks dropped (modelled), {label}: per-moment vs single "
                       "reserve; vs per-moment copying them"] = _clean_savings(report.rows, suffix)  # fmt: skip
    report.summary |= {
        "auto worst x optimum": worst["auto"],
        "auto+prefetch worst x optimum": worst["auto+prefetch"],
        "static worst x optimum": worst["static"],
        "lru worst x optimum": worst["lru"],
        "auto with activations worst x optimum": worst["auto, with activations"],
        "auto+prefetch with activations worst x optimum": worst["auto+prefetch, with activations"],
        "auto with activations worst x optimum, hybrid Adam": worst.get(
            f"auto, with activations{HYBRID}", 0.0
        ),
        "aim (auto within 1.10x of optimum) met": max(
            worst["auto"], worst["auto, with activations"]
        )
        <= 1.10,
        **{f"padding waste {p}": f"{100 * w:.2f}%" for p, w in waste.items()},
    }
    report.notes += [
        "Model states in mixed precision: fp16 parameter chunks (2 bytes; backward writes the "
        "gradients into their slots, as Gemini does with fp32 masters), fp32 master, Adam m and v "
        "(4 bytes each) in chunks with the parameter chunk's layout. (Earlier runs traced a "
        "separate fp16 gradient chunk, which the runtime does not have.)",
        "Every step needs its chunks on the accelerator; bytes moved count loads and evictions "
        "(real copies in the manager). The plain rows have no non-model data; the 'with activations' rows do.",
        "x_optimum: steady-state bytes per iteration divided by Belady's MIN on the same trace "
        "and capacity. Chunks of unequal size (2 vs 4 bytes per element) make furthest-next-use "
        "a yardstick rather than a proven optimum.",
        "static: the smallest equal fraction of chunks of each kind kept off the accelerator so that "
        "the rest plus the largest step fit; offloaded chunks go back to the host after each use.",
        "auto: Belady eviction from the warmup-traced compute order; auto+prefetch also loads the "
        "next moment's chunks right after each step, evicting only chunks needed later "
        "(a worker thread in emulation, a CUDA side stream on GPUs); prefetched_pct: share of loads "
        "issued ahead of use. 'auto, warmup iteration (cold)': the first iteration, before any "
        "trace (LRU, 80% budget share), against Belady's first iteration.",
        f"'with activations': non-model data takes part of the budget at every step: saved "
        f"activations of batch {ACT_BATCH} x {ACT_SEQ} tokens (16-bit, no recomputation, "
        "Korthikanti et al. 2022 per-layer formula) growing through forward and shrinking through "
        "backward. Belady gets the exact room left at each step; auto is told the per-moment "
        "peaks through a MemStatsSource and reserves the highest of the current and next moment "
        "(lookahead=1), as it must when prefetching. 'single reserve': auto told only the step's "
        "highest non-model peak, reserved at every moment (what Gemini training did before it "
        "measured moments); per-moment planning's gain is its bytes over the per-moment row's.",
        "'auto, real ChunkManager (measured)': the same trace replayed through ChunkManager with "
        "real tensors on an emulated accelerator; its counted bytes equal the simulation's.",
        f"'{HYBRID[2:]}' rows: the trace without the optimizer moments that bring every chunk's "
        "master and Adam states to the accelerator: Gemini's hybrid Adam updates states where "
        "they live (host states on the host), so only parameter chunks (holding gradients in "
        "backward) move; its "
        "staging of gradients and refreshed parameters (at most 4 bytes per parameter per "
        "step here) is the same for both plans and not counted. Where both plans move nothing "
        "(everything fits beside the activations), there is no saving to measure.",
        "auto with activations equals Belady's optimum on the same per-moment room in every "
        "configuration: per-moment planning's gain over the single reserve is bounded by how "
        "much the optimum itself gains, not by the policy. The summary gives, per configuration, "
        "auto's saving, the optimum's (Belady on the per-moment room vs Belady on the single "
        "reserve's constant room: 'belady (optimum), single reserve' rows) and a ceiling (the "
        "optimum with no activations at all vs the single reserve).",
        f"'{CLEAN[2:]}' rows: what keeping a home copy of every chunk loaded onto the "
        "accelerator would save ([Note: clean evictions] in colossal_chunk's simulator): "
        "evicting a chunk no step changed since its load (a parameter chunk in forward) copies "
        "nothing back. ChunkManager does not do this (a move frees the source tier, so the "
        "host would need room for a second copy of every resident chunk); the rows are a "
        "simulation, not a measurement.",
        "Why the optimum gains little at 50% and 75% with states to the accelerator: a chunk "
        "stays resident from one use to the next only if it fits beside the activations at "
        "every moment in between, and the interval of every master and Adam chunk (used once, "
        "at the optimizer step) contains the activation peak of the next forward/backward "
        "turn, where the per-moment room equals the single reserve's (budget - peak). Parameter "
        "chunks fit beside the peak in both plans at those budgets, so the states' streaming, "
        "the same for both plans, is what moves; per-moment room helps only where the working "
        "set beside the activations is short of room (the 25% budgets). The 20% aim is out of "
        "reach there by construction, not by the policy: the optimum's own saving is the bound.",
    ]
    _plot(report, out_dir)
    return report


def _plot(report: Report, out_dir: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    labels = ["static", "lru", "auto", "auto+prefetch"]
    presets = list(dict.fromkeys(r["preset"] for r in report.rows if r["policy"] in labels))
    fig, axes = plt.subplots(1, len(presets), figsize=(5 * len(presets), 3.5), squeeze=False)
    for ax, preset in zip(axes[0], presets):
        for j, label in enumerate(labels):
            rows = [r for r in report.rows if r["preset"] == preset and r["policy"] == label]
            xs = [i + 0.2 * (j - 1.5) for i in range(len(rows))]
            ax.bar(xs, [r["x_optimum"] for r in rows], width=0.2, label=label)
            ax.set_xticks(range(len(rows)), [r["budget"] for r in rows])
        ax.axhline(1.10, color="k", lw=0.8, ls="--")
        ax.set_title(f"GPT {preset}: bytes moved / optimum")
        ax.set_xlabel("accelerator budget (share of model states)")
    axes[0][0].legend()
    fig.tight_layout()
    out_dir.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_dir / "movement.png", dpi=110)
    plt.close(fig)
    report.figures.append("movement.png")
