"""The trials of ``bench_lora_capacity``, each run in a subprocess of its own:

    python benchmarks/_lora_capacity_runs.py trial|time JSON

prints one line ``RESULT {...}``: ``trial`` trains the spec's GPT (LoRA or full) 3 steps under
Gemini with its budgets, ``time`` alternates Gemini LoRA and plain peft steps.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MiB = 2**20
RANK = 8
STEPS = 2  # measured steps after one warmup (traced) step: 3 steps in all
# alternated Gemini / plain peft steps in the timing trial, after a warmup pair
TIME_STEPS = int(os.environ.get("BENCH_LORA_TIME_STEPS", "5"))
PRECISION = "bf16"
_TARGETS = ["attn.qkv", "attn.proj", "mlp.fc", "mlp.proj"]  # what attn,mlp resolve to on GPT


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
        payload = gm.runtime.manager.books.payload_bytes()
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


def _main(argv: list[str]) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    mode, spec = argv[0], json.loads(argv[1])
    result = _fit_trial(spec) if mode == "trial" else _time_trial(spec)
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
