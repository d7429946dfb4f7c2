"""Capacity with a disk tier: the largest GPT that trains 3 steps under an emulated accelerator
budget B, a host budget H and a disk budget D, against plain PyTorch under B alone; with the
disk bytes read and written per step and the disk throughput the tier reached, against a plain
sequential write and read of the same size in the same run, in the same directory.

Gemini's GPT blocks are activation-checkpointed ([Note: checkpointed regions] in
colossal-zero). Gemini plans each moment (whole budget for chunks, the warmup's measured
non-model bytes per moment; ``MomentRecorder``), chunks spill host -> disk when H is full
(fp32 states are added last, so Adam states land on disk first), and the disk tier reads ahead /
writes behind on its background threads ([Note: disk read-ahead and write-behind]). A run fits only if the tiers'
accounting never exceeds B, H, D (a move past them is a ``CapacityError``) and the losses stay
finite. Plain PyTorch fits when the traced peak of a full AdamW step is within B (the meta-device
live-tensor estimate, as ``capacity`` does).
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
from pathlib import Path

from _capacity_disk_baselines import (
    _read_file,
    _sequential,
    _sequential_aged,
    _store_alone,
    _write_file,
)
from _capacity_disk_trial import _gemini_disk_fits, _inputs
from bench_capacity import BYTES_PER_PARAM, _cfg, _largest, _trace

from _report import Report, load_note

MiB, GiB = 2**20, 2**30
ROUNDS = 3  # sequential baselines, each followed by a pass of the store alone of the same size
_SEQ_CAP = 2 * GiB  # the baseline's size at most (a full step moves ~6 GiB: minutes per round)
_GAP_CAP = 4 * GiB  # bytes written between the aged baseline's write and its read, at most


def _spread(xs: list[float]) -> str:
    return f"{min(xs):.0f}-{max(xs):.0f} (median {statistics.median(xs):.0f})"


def run(quick: bool, out_dir: Path) -> Report:
    b, h, d = (8 * MiB, 64 * MiB, 512 * MiB) if quick else (32 * MiB, 512 * MiB, 4 * GiB)
    # width: the largest parameter (an MLP matrix, 16 w^2 fp32 bytes) must fit B with room to
    # spare; depth descending: the first that trains is the largest
    width = 256 if quick else 512
    limit = (b + h + d) / BYTES_PER_PARAM
    # the deepest model within each fraction of the limit, deepest first (a trial of the full
    # config takes minutes on 2 cores: a coarse search around the predicted limit)
    fracs = (0.9, 0.85, 0.7) if quick else (0.87, 0.83, 0.75)
    load_before = os.getloadavg()[0]
    only = os.environ.get("BENCH_DISK_DEPTH")  # one known depth instead of the search
    depths = (
        [int(only)]
        if only
        else sorted(
            {
                max(dp for dp in range(1, 200) if _cfg(dp, width).num_params() <= f * limit)
                for f in fracs
            },
            reverse=True,
        )
    )
    where = Path(tempfile.mkdtemp(prefix="bench-disk-", dir=os.environ.get("BENCH_DISK_DIR")))
    report = Report(
        name="capacity_disk",  # run.py writes capacity_disk_quick.* for --quick
        title=f"Largest GPT that trains 3 steps in an emulated {b // MiB} MiB accelerator budget "
        f"+ {h // MiB} MiB host + {d / GiB:g} GiB disk",
        columns=[
            "method",
            "depth",
            "width",
            "params",
            "acc_peak_MiB",
            "host_peak_MiB",
            "disk_peak_MiB",
            "disk_read_MiB_per_step",
            "disk_written_MiB_per_step",
            "disk_unwritten_MiB_per_step",
            "tier_read_MiB_s",
            "tier_write_MiB_s",
            "tier_MiB_s",
            "disk_busy_s_per_step",
            "step_s",
            "rss_peak_MiB",
        ],
    )
    try:
        plain = None
        for dp in [2, 4, 8]:
            got = _largest(
                lambda w, dp=dp: _trace(_cfg(dp, w), _inputs)[0] <= b or None,
                [64, 96, 128, 160, 192, 224, 256, 320],
            )
            if got and (plain is None or _cfg(dp, got[0]).num_params() > plain[2]):
                plain = (dp, got[0], _cfg(dp, got[0]).num_params())
        if plain:
            peak = _trace(_cfg(plain[0], plain[1]), _inputs)[0]
            report.rows.append(
                {"method": "plain PyTorch", "depth": plain[0], "width": plain[1],
                 "params": plain[2], "acc_peak_MiB": peak / MiB}
            )  # fmt: skip
        cold = where / "written-before.bin"  # extra baseline: read after the trial's steps
        cold_size = (256 if quick else 1024) * MiB
        _write_file(cold, cold_size)
        best, tried = None, []
        for depth in depths:
            tried.append(depth)
            print(f"trying Gemini + disk {depth}x{width} ...", flush=True)
            fig = _gemini_disk_fits(depth, width, b, h, d, where)
            if fig:
                best = (depth, fig)
                break
        seq = (float("nan"), float("nan"))
        seqs: list[tuple[float, float]] = []
        alone: list[tuple[float, float]] = []
        aged: list[float] = []
        cold_read = float("nan")
        profile: dict[str, object] = {}
        if best:
            depth, fig = best
            payload = fig.pop("payload_bytes")
            profile = fig.pop("read_profile")
            report.rows.append(
                {"method": "Gemini auto + disk", "depth": depth, "width": width, **fig}
            )
            size = int(max(fig["disk_written_MiB_per_step"], fig["disk_read_MiB_per_step"]) * MiB)
            size = min(max(size, 64 * MiB), _SEQ_CAP)
            cold_read = _read_file(cold, min(size, cold_size))
            # what the tier writes between a payload's write-behind and its next read: at most
            # a step's writes (each payload is read once a step; capped: a smaller gap favours
            # the baseline)
            gap = min(int(fig["disk_written_MiB_per_step"] * MiB), _GAP_CAP)
            for _ in range(ROUNDS):  # alternated: the shared virtual disk's rate drifts
                seqs.append(_sequential(where, size))
                aged.append(_sequential_aged(where, size, gap))
                alone.append(_store_alone(where, size, payload))
            seq = (
                statistics.median(s[0] for s in seqs),
                statistics.median(s[1] for s in seqs),
            )
            report.rows.append(
                {"method": f"plain sequential file (median of {ROUNDS}, same dir)", "params": "-",
                 "tier_write_MiB_s": seq[0], "tier_read_MiB_s": seq[1]}
            )  # fmt: skip
            report.rows.append(
                {"method": f"plain file read after {gap / GiB:.1f} GiB written since (median of "
                 f"{ROUNDS}, same dir)", "params": "-",
                 "tier_read_MiB_s": statistics.median(aged)}
            )  # fmt: skip
            report.rows.append(
                {"method": f"disk store alone (median of {ROUNDS}, same dir)", "params": "-",
                 "tier_write_MiB_s": statistics.median(a[0] for a in alone),
                 "tier_read_MiB_s": statistics.median(a[1] for a in alone)}
            )  # fmt: skip
            report.rows.append(
                {"method": "extra: plain file written before the trial, read after it",
                 "params": "-", "tier_read_MiB_s": cold_read}
            )  # fmt: skip
    finally:
        shutil.rmtree(where, ignore_errors=True)
    n = best[1]["params"] if best else 0
    plain_n = plain[2] if plain else 0
    fig = best[1] if best else {}
    # a plain sequential read and write of the step's sizes, one after the other, against the
    # seconds the tier had either in flight ([Note: busy time])
    together = float("nan")
    if fig and aged and fig["disk_busy_s_per_step"]:
        seq_s = (
            fig["disk_read_MiB_per_step"] / statistics.median(aged)
            + fig["disk_written_MiB_per_step"] / seq[0]
        )
        together = seq_s / fig["disk_busy_s_per_step"]
    report.summary = {
        "B, H, D (MiB)": f"{b // MiB}, {h // MiB}, {d // MiB}",
        "largest plain PyTorch params (under B)": plain_n,
        "largest Gemini + disk params": n,
        "Gemini + disk / plain": n / plain_n if plain_n else float("inf"),
        "Gemini + disk / (B/16: plain's bound with no activations at all)": n / (b / 16),
        "limit (B+H+D)/16 B per param": int(limit),
        "Gemini + disk / limit": n / limit,
        "disk write throughput / sequential": fig.get("tier_write_MiB_s", 0) / seq[0],
        "disk read throughput / sequential": fig.get("tier_read_MiB_s", 0) / seq[1],
        "disk read throughput / sequential read of data as old as the payloads": (
            fig.get("tier_read_MiB_s", 0) / statistics.median(aged) if aged else float("nan")
        ),
        "disk throughput, reads and writes together / a plain sequential read and write of "
        "the same sizes": together,
        "extra: read of a file written before the trial / sequential": cold_read / seq[1],
        "sequential write MiB/s over the rounds": _spread([s[0] for s in seqs]) if seqs else "-",
        "sequential read MiB/s over the rounds": _spread([s[1] for s in seqs]) if seqs else "-",
        "read of data as old as the payloads MiB/s over the rounds": (
            _spread(aged) if aged else "-"
        ),
        "store alone write MiB/s over the rounds": _spread([a[0] for a in alone]) if alone else "-",
        "store alone read MiB/s over the rounds": _spread([a[1] for a in alone]) if alone else "-",
        "store alone / sequential, write and read (median)": (
            f"{statistics.median(a[0] for a in alone) / seq[0]:.2f}, "
            f"{statistics.median(a[1] for a in alone) / seq[1]:.2f}"
            if alone
            else "-"
        ),
        **{f"reads in the measured steps: {k}": v for k, v in profile.items()},
        "aim: >= 120x plain": plain_n > 0 and n >= 120 * plain_n,
        "aim: >= 85% of limit": n >= 0.85 * limit,
        "aim: disk throughput, reads and writes together, >= 70% of a plain sequential read "
        "and write of the same sizes": together >= 0.7,
        "aim: disk write throughput >= 70% of sequential": bool(fig)
        and fig["tier_write_MiB_s"] >= 0.7 * seq[0],
        "aim: disk read throughput >= 70% of a sequential read of data as old as the payloads": (
            bool(aged) and fig["tier_read_MiB_s"] >= 0.7 * statistics.median(aged)
        ),
        "the same against a sequential read of a file just written": bool(fig)
        and fig["tier_read_MiB_s"] >= 0.7 * seq[1],
        f"depths tried (width {width})": ", ".join(str(x) for x in tried),
    }
    report.notes = [
        "Accelerator emulated on the CPU (its capacity is the chunk manager's accounting); host "
        "and disk budgets are enforced the same way. fp32, AdamW, batch 1 x 8 tokens. Gemini's "
        "blocks are activation-checkpointed (each keeps only its input; one block is "
        "recomputed at a time in backward), so activations no longer bound depth within B; "
        "the plain PyTorch row is not checkpointed (at 8 tokens its activations are small: "
        "B/16 bounds it either way).",
        "Depths are tried deepest first at fractions of the limit (a coarse search: one trial "
        "of the full config takes many minutes on the loaded 2-core machine); the first that "
        "trains is the row.",
        "Disk bytes are what the tier's background threads read ahead (MADV_POPULATE_READ "
        "into the payload's mapping) and wrote behind (sync_file_range, then dropped from the "
        "page cache); device bytes are the process's storage I/O counters (psutil), which "
        "also see page faults that missed a read-ahead. Unwritten: parameter chunks moved "
        "back to disk within a forward or backward by mapping the payload they were read from "
        "again, unchanged, instead of writing it (colossal-chunk's [Note: disk copies]).",
        "Tier throughput = bytes / seconds during which at least one of the tier's reads "
        "(writes) was in flight, from its issue (a payload put on disk: from the pwrite that "
        "copies it into the page cache, as the baseline's first write call) to the end of its "
        "job (overlaps counted once; includes the I/O threads' waits for the interpreter lock "
        "and for a CPU beside training). Reads and writes are in flight together for much of "
        "a step, and a write-out waits while reads are in flight (colossal-chunk's [Note: "
        "reads first]), so each direction's seconds include those the device spent on the "
        "other: tier_MiB_s counts each second once (bytes read and written / seconds with "
        "either in flight, disk_busy_s_per_step), against a plain sequential read (of a file "
        "as old as the payloads) and write of the step's sizes done one after the other. The sequential baseline writes (8 MiB writes, fdatasync) and reads (8 MiB "
        "preads after posix_fadvise DONTNEED: fincore shows none of the file left in the "
        "guest's page cache) one plain file of the same size (at most 2 GiB) in the same "
        "directory, timed from the first call to the last; it is measured three times after "
        "the trial, each round followed by the disk store alone (nothing else running: the "
        "trial's payload size, put from host tensors and written behind, then read "
        "ahead four at a time); medians are compared, the spread is in the summary.",
        "B/16 B per param bounds plain PyTorch with no activations at all; the ratio against "
        "that bound is given too.",
        load_note(load_before, "the virtual disk may be shared with other machines")
        + " The sequential file is read "
        "right after it was written, and the virtual disk serves recently written data from "
        "a cache below the guest (the rounds' spread is in the summary), while the "
        "tier reads payloads written a step before, beside its own write-behind and the "
        "training's compute: the store-alone rows separate the store's method from that. So the read aim compares "
        "with a plain file as old as the payloads: written, then the bytes the tier writes in "
        "a step (at most 4 GiB) written to another file, then read the same way; the ratio to "
        "the file read right after it was written is given too.",
        f"Extra row (not the aim's baseline): a plain file of {cold_size // MiB} MiB written "
        "(fdatasync, pages dropped) before the trial and read the same way after it, once the "
        "trial's own writes came in between: how fast the device reads data that was not "
        "written just before, as the tier's payloads are. The aim compares against the "
        "sequential rounds above.",
    ]
    return report
