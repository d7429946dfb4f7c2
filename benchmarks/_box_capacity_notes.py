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
        "checkpoint part picks the largest depth within 85% of (B + H + D) / (16 + 16) bytes "
        "per parameter, gives the tier D minus 16 bytes per parameter, saves after step 3 (the "
        "job's own end-of-run save), resumes with --resume --steps 4, and compares all four "
        "losses with an uninterrupted 4-step run bit for bit.",
        "Search: the planner's largest depth first (colossal.plan on this machine's --calibrate "
        "profile, device memory = B, host = H, disk = D, Gemini layouts only), then down by 8% "
        "after a failure or halfway up toward the (B + H + D) / 16 bound after a success.",
        "peak_rss: the job's VmHWM (kernel high-water mark) read just before it ends; "
        "memory_err = (plan's device + host bytes - peak RSS) / peak RSS; the plan models no "
        "Python/torch overhead (~0.4 GiB), which dominates at quick sizes and vanishes at 4B. "
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
    if quick:
        out.append(
            "--quick: fixed small budgets (B 8 MiB, H 32 MiB, D 128 MiB, width 256, seq 16, 2 "
            "search trials), not the machine's: it checks the flow, not the aims."
        )
    return out


def full_estimate(row: dict, quick: dict, full: dict) -> str:
    """What the full run needs, scaled from a quick trial ``row`` at the ``quick`` settings to
    the ``full`` ones: per parameter, the trial's disk bytes per step at its plain-file rates,
    and its step seconds per parameter-token (an upper bound for compute: they include I/O)."""
    n = 0.85 * (full["h"] + full["d"]) / 16
    scale = n * full["seq"] / (row["params"] * quick["seq"])
    read = n * row["disk_read_MiB_per_step"] / row["params"]  # MiB per step
    written = n * row["disk_written_MiB_per_step"] / row["params"]
    disk_s = written / row["seq_write_MiB_s"] + read / row["seq_read_MiB_s"]
    compute_s = row["step_s"] * scale
    setup_s = 16 * n / MiB / row["seq_write_MiB_s"]  # the tier written once, lazily
    step_lo, step_hi = disk_s, max(disk_s, compute_s)
    # 4 capacity trials of ~n (3 steps), the checkpoint part (2 runs of 4 steps at ~n/2),
    # the emulated claim (1.5B, 3 steps): ~ 12 + 4 + 1.5/n*3 steps of the largest size
    steps = 12 + 4 + 3 * 1.5e9 / n
    runs = 7
    lo, hi = (runs * setup_s + steps * step_lo) / 3600, (runs * setup_s + steps * step_hi) / 3600
    return (
        f"{n / 1e9:.2f}B params at 85%; per step {written / 1024:.0f} GiB written and "
        f"{read / 1024:.0f} GiB read ({disk_s / 60:.0f} min at this run's plain-file rates), "
        f"compute <= {compute_s / 60:.0f} min (quick's s/step per param-token, I/O included); "
        f"setup {setup_s / 60:.0f} min per run; about {lo:.0f}-{hi:.0f} h for the whole run "
        f"(7 runs, ~{steps:.0f} steps of the largest size); RAM {full['b'] / 2**30:.1f} + "
        f"{full['h'] / 2**30:.1f} GiB budgets + ~1 GiB per process, disk {full['d'] / 2**30:.0f} "
        "GiB; run it alone on the machine"
    )
