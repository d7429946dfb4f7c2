"""LoRA capacity: the largest GPT whose LoRA fine-tune (rank 8, Hugging Face ``peft``) trains 3
steps under Gemini with an emulated accelerator budget B and a host budget H, with and without
a disk tier D, against full fine-tuning under the same budgets; and the step time of the
largest LoRA fit against plain ``peft`` on one process, the two alternated step by step.

Every trial runs in a subprocess of its own (``python bench_lora_capacity.py trial JSON``), so
one trial's chunks, pools and threads never crowd the next and its peak RSS is its own. A run
fits only if the tiers' accounting never passes B, H, D (a move past them is a
``CapacityError``) and the losses are finite. Models grow by width and depth along one ladder
sorted by parameters (each width with depths from w/64 to w/16, steps of at least 5%), and the
largest fit is found by bisection over the rungs within [limit/4, limit], where the limit is
(B + H [+ D]) over the chunk bytes a parameter costs (2 for a frozen bf16 one, 14 for a
trainable one: value, fp32 master, two Adam moments): nothing above it can fit.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MiB, GiB = 2**20, 2**30
RANK = 8
STEPS = 2  # measured steps after one warmup (traced) step: 3 steps in all
# alternated Gemini / plain peft steps in the timing trial, after a warmup pair
TIME_STEPS = int(os.environ.get("BENCH_LORA_TIME_STEPS", "5"))
PRECISION = "bf16"
WIDTHS = (128, 192, 256, 384, 512, 768, 1024)
_TRIAL_TIMEOUT_S = 900
_TARGETS = ["attn.qkv", "attn.proj", "mlp.fc", "mlp.proj"]  # what attn,mlp resolve to on GPT


# ---------------------------------------------------------------- in the trial's subprocess


def _build(depth: int, width: int, lora: bool):  # type: ignore[no-untyped-def]
    """Our GPT (seed 0, blocks activation-checkpointed), with peft LoRA (rank 8 on attn and
    mlp, the base frozen) when ``lora``."""
    import torch
    from bench_capacity import _cfg

    from colossal.lora import LoraSpec, lora_layers
    from colossal.lora._apply import import_peft
    from colossal_models import GPT, apply_activation_checkpointing

    torch.manual_seed(0)
    model = GPT(_cfg(depth, width))
    apply_activation_checkpointing(model)
    if lora:  # colossal.lora.apply_lora's wrap without the base fingerprint (seconds here)
        assert len(lora_layers(model, LoraSpec(rank=RANK), label="gpt")) == 4 * depth
        peft = import_peft()
        cfg = peft.LoraConfig(r=RANK, lora_alpha=RANK, target_modules=_TARGETS, bias="none")
        model = peft.get_peft_model(model, cfg)
    return model


def _non_model(depth: int, width: int, lora: bool) -> int:
    """The warmup step's reserve for non-model bytes (the per-moment measurement replaces it):
    memtrace's live-tensor estimate of the peak non-model bytes of the model's AdamW step on
    the meta device (LoRA: peft on the same layers; frozen weights make no gradients)."""
    import torch
    from bench_capacity import _cfg
    from bench_capacity_disk import _inputs

    from colossal.lora._apply import import_peft
    from colossal_memtrace import estimate_step
    from colossal_models import GPT, apply_activation_checkpointing

    peft = import_peft()

    def build():  # type: ignore[no-untyped-def]
        model = GPT(_cfg(depth, width))
        apply_activation_checkpointing(model)
        if lora:
            cfg = peft.LoraConfig(r=RANK, lora_alpha=RANK, target_modules=_TARGETS)
            model = peft.get_peft_model(model, cfg)
        return model

    def adamw(params):  # type: ignore[no-untyped-def]
        return torch.optim.AdamW([p for p in params if p.requires_grad], lr=1e-3)

    return estimate_step(build, _inputs, build_optimizer=adamw).peak_non_model("accelerator")


def _gemini(spec: dict[str, Any], model, disk_dir: Path | None):  # type: ignore[no-untyped-def]
    """``model`` under Gemini with the trial's budgets (per-moment planning: the warmup step
    reserves the estimated non-model peak and measures it per moment); and its optimizer."""
    import torch

    from colossal_memtrace import MomentRecorder
    from colossal_zero import GeminiConfig, GeminiOptimizer, apply_gemini

    trainable = [p for p in model.parameters() if p.requires_grad]
    cfg = GeminiConfig(
        precision=PRECISION,
        placement="auto",
        non_model_bytes=_non_model(spec["depth"], spec["width"], spec["method"] == "lora"),
        accelerator_bytes=spec["b"],
        host_bytes=spec["h"],
        disk_bytes=spec["d"],
        disk_dir=disk_dir,
        device="cpu",
    )
    gm = apply_gemini(model, cfg, group=None, recorder=MomentRecorder("cpu"))
    return gm, GeminiOptimizer.from_torch(gm, torch.optim.AdamW(trainable, lr=1e-3))


def _rss_peak_mib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _fit_trial(spec: dict[str, Any]) -> dict[str, Any]:
    """Train a warmup step and ``STEPS`` measured ones; the figures, or why it does not fit."""
    import torch
    from bench_capacity_disk import _inputs

    from colossal_contracts import CapacityError, ConfigError

    disk_dir = Path(tempfile.mkdtemp(prefix="bench-lora-", dir=os.environ.get("BENCH_DISK_DIR")))
    gm = None
    try:
        t_build = time.perf_counter()
        model = _build(spec["depth"], spec["width"], spec["method"] == "lora")
        n_params = sum(p.numel() for p in model.parameters())
        n_frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
        gm, gopt = _gemini(spec, model, disk_dir if spec["d"] else None)
        del model
        build_s = time.perf_counter() - t_build
        x, y = _inputs(torch.device("cpu"))
        losses, t0 = [], time.perf_counter()
        for i in range(STEPS + 1):
            if i == 1:
                t0 = time.perf_counter()
            loss = gm(x, y)
            gopt.backward(loss)
            gopt.step()
            gopt.zero_grad()
            losses.append(loss.item())
        step_s = (time.perf_counter() - t0) / STEPS
        stats = gm.memory_stats()
        where: dict[str, float] = {}  # bytes per parameter at the end, by tier and kind
        for c in gm.runtime.manager.chunks.values():
            key = f"{c.tier.value if c.tier else 'none'} {'frozen' if c.frozen else c.kind}"
            where[key] = where.get(key, 0.0) + c.shard_bytes / n_params
        payload = gm.runtime.manager.payload_bytes()
    except (CapacityError, ConfigError) as exc:
        return {"fits": False, "why": " ".join(str(exc).split())[:160]}
    finally:
        if gm is not None:
            gm.runtime.manager.close()
        shutil.rmtree(disk_dir, ignore_errors=True)
    tiers = stats.tiers
    finite = all(v == v and abs(v) != float("inf") for v in losses)
    return {
        "fits": finite,
        "why": "" if finite else f"losses {losses}",
        "all_params": n_params,
        "trainable_params": n_params - n_frozen,
        "acc_peak_MiB": tiers["accelerator"].peak_bytes / MiB,
        "host_peak_MiB": tiers["host"].peak_bytes / MiB,
        "disk_peak_MiB": tiers["disk"].peak_bytes / MiB if "disk" in tiers else 0.0,
        "frozen_chunk_bytes_per_frozen_param": payload.get("frozen", 0) / n_frozen
        if n_frozen
        else 0.0,
        "padding_MiB": stats.padding_bytes / MiB,
        "frozen_written_MiB": stats.frozen_written_bytes / MiB,
        "moved_MiB_per_step": stats.bytes_moved / (STEPS + 1) / MiB,
        "step_s": step_s,
        "build_s": build_s,
        "rss_peak_MiB": _rss_peak_mib(),
        "where": where,
    }


def _time_trial(spec: dict[str, Any]) -> dict[str, Any]:
    """Gemini LoRA (B, H, no disk) and plain peft on one process (the same bf16 base and
    batches, adapters in fp32 as peft keeps them, torch AdamW), one step of each in turn."""
    import torch
    from bench_capacity_disk import _inputs

    from colossal.lora._apply import import_peft

    peft = import_peft()
    plain = _build(spec["depth"], spec["width"], lora=False).to(torch.bfloat16)
    cfg = peft.LoraConfig(r=RANK, lora_alpha=RANK, target_modules=_TARGETS, bias="none")
    plain = peft.get_peft_model(plain, cfg)  # adapters in fp32 (peft's autocast_adapter_dtype)
    popt = torch.optim.AdamW([p for p in plain.parameters() if p.requires_grad], lr=1e-3)
    gm, gopt = _gemini(spec, _build(spec["depth"], spec["width"], lora=True), None)
    x, y = _inputs(torch.device("cpu"))
    times: dict[str, list[float]] = {"gemini": [], "plain": []}
    losses: dict[str, list[float]] = {"gemini": [], "plain": []}

    def gemini_step() -> float:
        loss = gm(x, y)
        gopt.backward(loss)
        gopt.step()
        gopt.zero_grad()
        return loss.item()

    def plain_step() -> float:
        loss = plain(x, y)
        loss.backward()
        popt.step()
        popt.zero_grad()
        return loss.item()

    try:
        for i in range(TIME_STEPS + 1):  # pair 0 is the warmup (Gemini traces it)
            order = (("gemini", gemini_step), ("plain", plain_step))
            for name, step in order if i % 2 == 0 else order[::-1]:
                t0 = time.perf_counter()
                losses[name].append(step())
                if i:
                    times[name].append(time.perf_counter() - t0)
    finally:
        gm.runtime.manager.close()
    return {
        "gemini_step_s": statistics.median(times["gemini"]),
        "plain_step_s": statistics.median(times["plain"]),
        "ratios": [g / p for g, p in zip(times["gemini"], times["plain"], strict=True)],
        "max_loss_diff": max(
            abs(a - b) for a, b in zip(losses["gemini"], losses["plain"], strict=True)
        ),
        "rss_peak_MiB": _rss_peak_mib(),
    }


# ---------------------------------------------------------------- in the parent


def _run_child(mode: str, spec: dict[str, Any]) -> dict[str, Any]:
    """One trial in a fresh interpreter; its JSON result (a crash or timeout: does not fit,
    with the reason)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), mode, json.dumps(spec)]
    try:
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=_TRIAL_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        return {"fits": False, "why": f"timed out after {_TRIAL_TIMEOUT_S} s"}
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    tail = " ".join((done.stderr or done.stdout).strip().splitlines()[-1:])[:200]
    return {"fits": False, "why": f"trial exited {done.returncode}: {tail}"}


def ladder(lo: float, hi: float) -> list[tuple[int, int, int]]:
    """(params, depth, width) rungs with params in [lo, hi], ascending, each at least 5% above
    the one before; each width with depths from w/64 to w/16 (at least 2)."""
    from bench_capacity import _cfg

    cands = sorted(
        {
            (_cfg(d, w).num_params(), d, w)
            for w in WIDTHS
            for d in range(max(2, w // 64), max(2, w // 16) + 1)
        }
    )
    out: list[tuple[int, int, int]] = []
    for n, d, w in cands:
        if lo <= n <= hi and (not out or n >= 1.05 * out[-1][0]):
            out.append((n, d, w))
    return out


def _search(rungs, fits, guess: int):  # type: ignore[no-untyped-def]
    """The largest rung that fits (fitting taken as monotone in parameters): the predicted
    rung ``guess`` first, then rungs at 1, 2, 4 ... above it (while they fit) or below it
    (while they do not) until one fits and one does not, then bisection between them; None
    when no rung fits. About 2-3 trials where the prediction is close."""
    res: dict[int, dict[str, Any]] = {}

    def ok(i: int) -> bool:
        if i not in res:
            res[i] = fits(rungs[i])
        return bool(res[i].get("fits"))

    if ok(guess):
        lo, step = guess, 1
        while lo + step < len(rungs) and ok(lo + step):
            lo, step = lo + step, 2 * step
        hi = min(len(rungs), lo + step)
    else:
        hi, step = guess, 1
        while hi - step >= 0 and not ok(hi - step):
            hi, step = hi - step, 2 * step
        lo = max(-1, hi - step)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return (rungs[lo], res[lo]) if lo >= 0 else None


def _predicted_bytes(method: str, depth: int, width: int) -> float:
    """Chunk bytes a rung needs by the formula (2 B a frozen bf16 parameter, 14 B a trainable
    one), plus 4% for padding: where the search starts."""
    from bench_capacity import _cfg

    n = _cfg(depth, width).num_params()
    if method == "full":
        return 1.04 * 14 * n
    adapters = RANK * 16 * width * depth  # qkv h->3h, proj h->h, fc h->4h, proj 4h->h
    return 1.04 * (2 * n + 14 * adapters)


def run(quick: bool, out_dir: Path) -> Any:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from colossal_zero import chunk_bytes_per_param

    from _report import Report

    b, h, d = (8 * MiB, 64 * MiB, 64 * MiB) if quick else (32 * MiB, 512 * MiB, 256 * MiB)
    load_before = os.getloadavg()[0]
    per_param = {
        "lora": chunk_bytes_per_param(PRECISION, frozen=True),
        "full": chunk_bytes_per_param(PRECISION),
    }
    report = Report(
        name="lora_capacity",
        title=f"Largest GPT that fine-tunes 3 steps with LoRA r{RANK} vs full fine-tuning under "
        f"Gemini in an emulated {b // MiB} MiB accelerator tier + {h // MiB} MiB host "
        f"(+ {d // MiB} MiB disk)",
        columns=["method", "disk", "depth", "width", "params", "trainable", "of_limit", "acc_peak_MiB",
                 "host_peak_MiB", "disk_peak_MiB", "frozen_B_per_param", "moved_MiB_per_step",
                 "step_s", "rss_peak_MiB", "trials"],
    )  # fmt: skip
    t_start, trials = time.perf_counter(), [0]
    best: dict[tuple[str, bool], dict[str, Any]] = {}
    log: list[str] = []
    searches = [(m, disk) for disk in (False, True) for m in ("full", "lora")]
    with Progress(
        TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), transient=False
    ) as progress:
        for method, disk in searches:
            room = b + h + (d if disk else 0)
            limit = room / per_param[method]
            rungs = ladder(limit / 4, limit)
            label = f"{method} {'+ disk' if disk else 'no disk'}"
            guess = max(
                [0] + [i for i, r in enumerate(rungs) if _predicted_bytes(method, *r[1:]) <= room]
            )
            steps = 3
            task = progress.add_task(f"{label}: {len(rungs)} rungs", total=steps)
            n_trials = [0]

            def fits(rung, method=method, disk=disk, task=task, label=label, n=n_trials):  # type: ignore[no-untyped-def]
                params, depth, width = rung
                progress.update(
                    task, description=f"{label}: trying {depth}x{width} ({params / 1e6:.1f}M)"
                )
                spec = {"method": method, "depth": depth, "width": width, "b": b, "h": h,
                        "d": d if disk else 0}  # fmt: skip
                got = _run_child("trial", spec)
                trials[0] += 1
                n[0] += 1
                progress.advance(task)
                verdict = "fits" if got.get("fits") else f"does not fit ({got.get('why', '')})"
                log.append(f"{label} {depth}x{width} {params / 1e6:.1f}M: {verdict}")
                progress.console.print(f"  {log[-1]}")
                return got

            found = _search(rungs, fits, guess)
            progress.update(
                task, total=n_trials[0], completed=n_trials[0], description=f"{label}: done"
            )
            if found is None:
                continue
            (params, depth, width), fig = found
            best[(method, disk)] = {**fig, "depth": depth, "width": width, "params": params}
            report.rows.append(
                {"method": f"Gemini {'LoRA r8' if method == 'lora' else 'full fine-tune'}",
                 "disk": f"{d // MiB} MiB" if disk else "-", "depth": depth, "width": width,
                 "params": params, "trainable": fig["trainable_params"],
                 "of_limit": params / limit,
                 "acc_peak_MiB": fig["acc_peak_MiB"], "host_peak_MiB": fig["host_peak_MiB"],
                 "disk_peak_MiB": fig["disk_peak_MiB"],
                 "frozen_B_per_param": fig["frozen_chunk_bytes_per_frozen_param"],
                 "moved_MiB_per_step": fig["moved_MiB_per_step"], "step_s": fig["step_s"],
                 "rss_peak_MiB": fig["rss_peak_MiB"], "trials": n_trials[0]}
            )  # fmt: skip
        timing: dict[str, Any] = {}
        lora_fit = best.get(("lora", False))
        if lora_fit:
            task = progress.add_task(
                f"step time: Gemini LoRA vs plain peft at {lora_fit['depth']}x{lora_fit['width']}",
                total=1,
            )
            spec = {"method": "lora", "depth": lora_fit["depth"], "width": lora_fit["width"],
                    "b": b, "h": h, "d": 0}  # fmt: skip
            timing = _run_child("time", spec)
            progress.advance(task)
    _summarise(report, best, timing, b, h, d, per_param, load_before)
    report.summary["search: trials, minutes"] = (
        f"{trials[0]}, {(time.perf_counter() - t_start) / 60:.1f}"
    )
    report.summary["trials"] = "; ".join(log)
    return report


def _summarise(report, best, timing, b, h, d, per_param, load_before) -> None:  # type: ignore[no-untyped-def]
    from _report import load_note

    for disk in (False, True):
        tag = "with disk" if disk else "no disk"
        room = b + h + (d if disk else 0)
        full = best.get(("full", disk), {}).get("params", 0)
        lora = best.get(("lora", disk), {}).get("params", 0)
        report.summary[f"largest full fine-tune params, {tag}"] = full
        report.summary[f"largest LoRA params, {tag}"] = lora
        report.summary[f"LoRA / full, {tag}"] = lora / full if full else float("nan")
        report.summary[f"aim: LoRA >= 6x full, {tag}"] = bool(full) and lora >= 6 * full
        report.summary[f"LoRA / its limit (B+H{'+D' if disk else ''}) / 2 B, {tag}"] = lora / (
            room / per_param["lora"]
        )
        report.summary[f"full / its limit (B+H{'+D' if disk else ''}) / 14 B, {tag}"] = full / (
            room / per_param["full"]
        )
        fit = best.get(("lora", disk))
        if fit:
            spread = ", ".join(
                f"{k} {v:.3f}" for k, v in sorted(fit["where"].items()) if v >= 0.001
            )
            report.summary[f"chunk bytes per param at the largest LoRA fit, {tag}"] = spread
            report.summary[f"frozen chunk bytes written, {tag} (MiB)"] = fit["frozen_written_MiB"]
    if timing and "gemini_step_s" in timing:
        ratio = statistics.median(timing["ratios"])  # pairs are adjacent: load drift cancels
        report.summary["step time, Gemini LoRA (B, H) / plain peft, median of per-pair ratios"] = (
            f"{ratio:.3f} (median steps {timing['gemini_step_s']:.2f} s vs "
            f"{timing['plain_step_s']:.2f} s; per pair "
            f"{', '.join(f'{r:.2f}' for r in timing['ratios'])})"
        )
        report.summary["aim: step time <= 1.10x plain peft"] = ratio <= 1.10
        report.summary["max |loss difference| Gemini vs plain peft (both bf16)"] = timing[
            "max_loss_diff"
        ]
    elif timing:
        report.summary["step time trial"] = f"failed: {timing.get('why')}"
    report.notes = [
        "Accelerator emulated on the CPU: the accelerator, host and disk budgets are the chunk "
        "manager's accounting of chunk payloads (a move past one is a CapacityError); figures "
        "are labelled emulated accelerator tier. acc_peak_MiB is chunk bytes alone (per-moment "
        "planning keeps each moment's measured non-model bytes free beside them).",
        f"{PRECISION} compute precision; LoRA through peft (colossal.lora.apply_lora: rank {RANK}, "
        "alpha 8, attn and mlp linear layers; every base weight frozen in Gemini's frozen chunks: "
        "its bf16 value only), full fine-tuning with fp32 masters and AdamW states (14 B a "
        "parameter); torch AdamW wrapped by GeminiOptimizer; batch 1 x 8 tokens, byte "
        "vocabulary; GPT blocks activation-checkpointed (so activations never bound depth).",
        "Each trial (3 steps: one warmup step, traced, and 2 measured ones) runs in its own "
        "subprocess; "
        "rss_peak_MiB is that process's peak resident set (it includes the fp32 model built "
        "before Gemini takes it, which the budgets do not count).",
        "Step time: the largest LoRA fit without disk under Gemini (B, H) against plain peft on "
        "one process with no budget (the same bf16 base, adapters in fp32 as peft keeps them, "
        "torch AdamW, the same batch), one step of each in turn (order swapped every pair) "
        f"after a warmup pair, {TIME_STEPS} pairs; the median of the per-pair ratios (each "
        "pair's two steps are adjacent in time, so the shared machine's load drift cancels "
        "more than in a ratio of medians).",
        load_note(load_before, "the machine is shared with other jobs: step times move with it"),
    ]


def _main(argv: list[str]) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    mode, spec = argv[0], json.loads(argv[1])
    result = _fit_trial(spec) if mode == "trial" else _time_trial(spec)
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
