"""The method notes of ``bench_box_capacity``'s report, and what a full run costs."""

from __future__ import annotations

MiB = 2**20


def notes(quick: bool, s: dict) -> list[str]:
    """Plain sentences for the report: method, what is emulated, what the figures mean."""
    out = [
        "Accelerator emulated on the CPU (its capacity is the chunk manager's accounting, held in "
        "host RAM); host and disk budgets are enforced by Gemini's tiers (a move past one is a "
        "CapacityError). Every trial is one `colossal train` process: --model hf:PATH of a GPT-2 "
        "config.json (fixed width, searched depth, heads of 64, tied embeddings, the bytes "
        "tokenizer's 256 tokens), --plugin gemini --precision bf16 --batch-size 1, 3 steps.",
        "Capacity trials are killed once their third step record is written, before the final "
        "save: the tier fills the free disk and a checkpoint needs about as much again. The "
        "checkpoint part picks the largest depth within 85% of (B + H + D) / (16 + 13) bytes "
        "per parameter, gives the tier D minus 13 bytes per parameter (a checkpoint measures 12: fp32 masters and Adam's two states), runs 4 steps with "
        "--checkpoint-every 3 (the uninterrupted run: the save after step 3, killed after step 4 "
        "before its final save; any step-4 checkpoint and metrics record are removed), then "
        "--resume --steps 4 in the same --out, which trains step 4 from the step-3 checkpoint "
        "(both runs plan 4 steps: the learning-rate schedule depends on --steps); the four "
        "losses are compared bit for bit.",
        "Search: the planner's largest depth first (colossal.plan on this machine's --calibrate "
        "profile, device memory = B, host = H, disk = D, Gemini layouts only; at most 95% of "
        "(B + H + D) / 16, where chunks fragment the last percent), then down by 8% "
        "after a failure or halfway up toward the (B + H + D) / 16 bound after a success.",
        "peak_rss: the job's VmHWM (kernel high-water mark) read just before it ends, which "
        "counts the disk tier's file pages mapped into the process; peak_anon: the most "
        "RssAnon + RssShmem seen (sampled every 0.2 s), the process's own memory. "
        "plan_model_MiB: the plan's device + host bytes (the emulated accelerator is RAM too); "
        "plan_memory_MiB adds the process baseline (the RSS of a fresh Python with torch, "
        "transformers and colossal loaded, measured once per run: the planner's bytes are the "
        "model's and leave the process out); memory_err = (plan_memory - peak RSS) / peak RSS, "
        "anon_err the same against peak_anon; tiers_err compares plan_model with the sum of "
        "the tiers' own peaks (which need not coincide). "
        "step_err: (plan's step seconds - measured mean of steps 2-3) / measured.",
        "Disk: tier rates from the job's step records (read ahead + faulted in, written behind; "
        "tier_*_MiB_s over the seconds with I/O in flight, steps 2-3); proc_*_MiB_s: the "
        "process's /proc/<pid>/io bytes (setup included) over its step seconds; seq_*: a plain "
        "file of the step's written bytes (at least 16 MiB, at most "
        f"{s['seq_cap'] // MiB} MiB) written (8 MiB writes, fdatasync) and read (pages dropped) "
        "in the same directory right after each trial.",
        "Claims: the emulated part gives the accelerator budget of Colossal-AI's RTX 2060 "
        "(6 GiB; quick: scaled) and the rest of the RAM budget as host, the disk as in the "
        "capacity part; the planner's answers for one RTX 3090 (64 GiB host; Colossal-AI says "
        "18B) and one RTX 2060 (16 GiB host; it says 1.5B) are for batch 1 x 1024 with no disk.",
    ]
    out += [
        "The plan's memory: its gemini-disk layout puts the 16-bit parameters on the host (2 B "
        "per parameter) and the fp32 masters and Adam states on disk (12 B), the accelerator "
        "holding one block's working set; Gemini's tiers instead fill the accelerator and host "
        "budgets before they spill to disk, so the job's resident memory is about B + H plus "
        "the process's overhead whatever the model: the plan matches it only when H is near 2 B "
        "per parameter. tiers_err compares the plan with the tiers' own accelerator + host peaks.",
        "bf16 matmuls: colossal train computes them natively where the CPU has bf16 kernels "
        "(AVX512-BF16 or AMX) and otherwise in fp32 through colossal_zero.Fp32Matmul (the job "
        "prints 'bf16 matmuls computed in fp32 on this CPU'; COLOSSAL_CPU_MATMUL=auto|fp32|"
        "native overrides); --calibrate and the full-run estimate time them the same way "
        "(matmul_mode in the calibrated profile). On a CPU without either, torch's own bf16 "
        "matmul ran at 0.05-5 GFLOP/s against ~300 in fp32. The full run's tokens per step are "
        "batch 1 x BENCH_BOX_SEQ (default 16).",
        "A failed trial's why is the job's own error line: 'fits on no tier' is Gemini finding "
        "no tier with room for one chunk while the three together still have some "
        "(fragmentation near (B + H + D) / 16).",
    ]
    if quick:
        out.append(
            "--quick: fixed small budgets (B 8 MiB, H 32 MiB, D 128 MiB, width 256, seq 16, 2 "
            "search trials), not the machine's: it checks the flow, not the aims. The full run "
            "(`python benchmarks/run.py box_capacity`, budgets from the machine: RAM minus 5 GiB "
            "(BENCH_BOX_RAM_MARGIN_GIB sets it), "
            "free disk minus 8 GiB; BENCH_BOX_DIR picks the disk) is estimated in the summary "
            "from this run's measurements; run it alone on the machine."
        )
    return out


def full_estimate(row: dict, quick: dict, full: dict, bf16_flops: float) -> str:
    """What the full run needs, scaled from a quick trial ``row`` at the ``quick`` settings to
    the ``full`` ones: per parameter, the trial's disk bytes per step at its plain-file rates;
    compute 6 x params x tokens FLOPs at ``bf16_flops`` (a bf16 matmul of the full run's shape
    timed on this machine)."""
    n = 0.85 * (full["h"] + full["d"]) / 16
    read = n * row["disk_read_MiB_per_step"] / row["params"]  # MiB per step
    written = n * row["disk_written_MiB_per_step"] / row["params"]
    disk_s = written / row["seq_write_MiB_s"] + read / row["seq_read_MiB_s"]
    compute_s = 6 * n * full["seq"] / bf16_flops
    setup_s = 16 * n / MiB / row["seq_write_MiB_s"]  # the tier written once, lazily
    # 4 capacity trials of ~n (3 steps), the checkpoint part (2 runs of 4 steps at ~n/2),
    # the emulated claim (1.5B, 3 steps): ~ 12 + 4 + 1.5/n*3 steps of the largest size
    steps, runs = 12 + 4 + 3 * 1.5e9 / n, 7
    total_h = (runs * setup_s + steps * (disk_s + compute_s)) / 3600
    return (
        f"{n / 1e9:.2f}B params at 85%; per step {written / 1024:.0f} GiB written and "
        f"{read / 1024:.0f} GiB read ({disk_s / 60:.0f} min at this run's plain-file rates) and "
        f"{6 * n * full['seq'] / 1e12:.1f} TFLOP at {bf16_flops / 1e9:.3g} GFLOP/s bf16 "
        f"({compute_s / 3600:.1f} h); setup {setup_s / 60:.0f} min per run; about "
        f"{total_h:.0f} h in all (7 runs, ~{steps:.0f} steps of the largest size, no overlap "
        f"of I/O and compute assumed); RAM {full['b'] / 2**30:.1f} + {full['h'] / 2**30:.1f} "
        f"GiB budgets + ~1 GiB per process, disk {full['d'] / 2**30:.0f} GiB"
    )
