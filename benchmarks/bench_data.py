"""The data path's speed and memory: tokens/s of ``prepare_data`` (the byte tokenizer and a
byte-level BPE trained here, in worker processes) and of the streaming ``TokenLoader`` alone,
against the tokens/s of GPT-tiny's training step on the same batch shape; and the process's RSS
while the loader streams a synthetic token dataset of 4 GiB (``--quick``: 64 MiB).

Aims (issue 31): the loader at least 20x faster than training; RSS growth while streaming at
most 64 MiB. The token dataset is written to a temporary folder and deleted afterwards; the RSS
trial runs in a fresh process so nothing else this benchmark allocated counts.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil
import torch

from colossal_models import GPT, GPTConfig, default_corpus_path
from colossal_models.data import (
    TokenizerBytes,
    TokenLoader,
    TokenShards,
    open_source,
    prepare_data,
    train_tokenizer,
)
from colossal_models.data._shards import ShardWriter

from _report import Report, environment, load_note

MiB = 2**20
BATCH, SEQ = 16, 128  # the main job's shape


def _corpus(root: Path, mib: int) -> Path:
    """A jsonl of standard-library sources, one document per file, repeated to ``mib`` MiB."""
    files = sorted(default_corpus_path().glob("*.py"))
    path, size = root / "corpus.jsonl", 0
    with path.open("w") as f:
        while size < mib * MiB:
            for p in files:
                line = json.dumps({"text": p.read_text(errors="replace")}) + "\n"
                f.write(line)
                size += len(line)
                if size >= mib * MiB:
                    break
    return path


def _prepare_rate(source, tokenizer, out: Path, workers: int) -> dict:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    shards = prepare_data(source, tokenizer, out, num_workers=workers)
    dt = time.perf_counter() - t0
    return {"tokens": shards.num_tokens, "seconds": dt, "tokens_per_s": shards.num_tokens / dt}


def _loader_rate(shards: TokenShards, batches: int) -> float:
    loader = TokenLoader(shards, seq_len=SEQ, batch_size=BATCH, val_fraction=0.0)
    loader.next_batch()
    t0 = time.perf_counter()
    for _ in range(batches):
        loader.next_batch()
    return batches * BATCH * SEQ / (time.perf_counter() - t0)


def _train_rate(steps: int) -> float:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny").with_vocab(256)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, 256, (BATCH, SEQ), device=device)

    def step() -> None:
        model(x, x).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    if device == "cuda":
        torch.cuda.synchronize()
    return steps * BATCH * SEQ / (time.perf_counter() - t0)


def _write_tokens(root: Path, num_bytes: int) -> Path:
    """``num_bytes`` of uint16 tokens (random ids under 50257, documents of ~4k tokens)."""
    rng = np.random.default_rng(0)
    root.mkdir()
    writer = ShardWriter(root, np.dtype(np.uint16))
    piece = 32 * MiB // 2
    for _ in range(num_bytes // (2 * piece)):
        writer.add(rng.integers(0, 50257, piece, dtype=np.uint16))
        for _ in range(piece // 4096):
            writer.end_document()
    writer.close({"tokenizer": {"spec": "synthetic", "fingerprint": "synthetic",
                                "vocab_size": 50257, "eot_id": 50256}})  # fmt: skip
    return root


def _stream_rss(folder: str, seq: int, batch: int) -> dict:
    """In a fresh process: stream every training window once; RSS before and its peak."""
    proc = psutil.Process()
    shards = TokenShards.open(folder)
    loader = TokenLoader(shards, seq_len=seq, batch_size=batch, val_fraction=0.0)
    loader.next_batch()
    base = proc.memory_info().rss
    peak, steps = base, loader.num_windows // batch
    t0 = time.perf_counter()
    for i in range(steps):
        loader.next_batch()
        if i % 64 == 0:
            peak = max(peak, proc.memory_info().rss)
    dt = time.perf_counter() - t0
    peak = max(peak, proc.memory_info().rss)
    return {"tokens_streamed": steps * batch * seq, "seconds": dt,
            "rss_before_MiB": base / MiB, "rss_growth_MiB": (peak - base) / MiB}  # fmt: skip


def run(quick: bool, out_dir: Path) -> Report:
    load = os.getloadavg()[0]
    workers = min(8, os.cpu_count() or 1)
    corpus_mib, token_bytes = (4, 64 * MiB) if quick else (16, 4 << 30)
    report = Report(
        name="data",
        title="Data path: tokens/s of data prepare and of the streaming loader against GPT-tiny's "
        f"training step ({BATCH} x {SEQ}), and RSS while streaming {token_bytes / 2**30:g} GiB "
        "of tokens",
        columns=["what", "tokens", "seconds", "tokens_per_s"],
    )
    root = Path(tempfile.mkdtemp(prefix="bench-data-"))
    try:
        corpus = _corpus(root, corpus_mib)
        sample = (p.text for i, p in enumerate(open_source(corpus).pieces()) if i < 200)
        bpe = train_tokenizer(sample, vocab_size=4096, out=root / "tok")
        src = open_source(corpus)
        for name, tok, n in (("bytes", TokenizerBytes(), 1), ("bpe-4096", bpe, workers)):
            r = _prepare_rate(src, tok, root / f"prep-{name}", n)
            report.rows.append({"what": f"data prepare, {name} ({n} process(es))", **r})
        shards = TokenShards.open(root / "prep-bpe-4096")
        batches = 200 if quick else 2000
        loader = _loader_rate(shards, batches)
        report.rows.append({"what": "loader alone", "tokens": batches * BATCH * SEQ,
                            "seconds": batches * BATCH * SEQ / loader, "tokens_per_s": loader})  # fmt: skip
        steps = 3 if quick else 10
        trained = _train_rate(steps)
        report.rows.append({"what": "GPT-tiny training step (fwd+bwd+AdamW)",
                            "tokens": steps * BATCH * SEQ,
                            "seconds": steps * BATCH * SEQ / trained, "tokens_per_s": trained})  # fmt: skip
        tokens = _write_tokens(root / "tokens", token_bytes)
        seq, batch = (2048, 64)
        argv = [sys.executable, __file__, str(tokens), str(seq), str(batch)]
        out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
        rss = json.loads(out.strip().splitlines()[-1])
        report.rows.append({"what": f"stream {token_bytes / 2**30:g} GiB of tokens ({batch} x "
                            f"{seq})", "tokens": rss["tokens_streamed"], "seconds": rss["seconds"],
                            "tokens_per_s": rss["tokens_streamed"] / rss["seconds"]})  # fmt: skip
    finally:
        shutil.rmtree(root, ignore_errors=True)
    report.summary = {
        "loader / training tokens/s": loader / trained,
        "loader at least 20x training": loader >= 20 * trained,
        "RSS growth while streaming (MiB)": rss["rss_growth_MiB"],
        "RSS growth at most 64 MiB": rss["rss_growth_MiB"] <= 64,
        "RSS before streaming (MiB)": rss["rss_before_MiB"],
    }
    env = environment()
    report.notes = [
        f"Training step on {env['accelerator']}; torch {env['torch']}, {env['cpu_threads']} "
        "threads. The loader reads its windows with pread (block-shuffled order), one "
        "process, no prefetch thread.",
        f"data prepare: a jsonl of {corpus_mib} MiB (standard-library sources repeated), the "
        f"BPE (4096 ids) trained on its first 200 documents; {workers} worker process(es) "
        "for the BPE; the byte tokenizer encodes in the main process.",
        "RSS: a fresh process opens the synthetic uint16 dataset (written here, deleted "
        "after) and streams every window once; growth is the peak RSS (sampled every 64 "
        "batches) minus the RSS after the first batch.",
        load_note(load),
    ]
    return report


if __name__ == "__main__":
    folder, seq, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    print(json.dumps(_stream_rss(folder, seq, batch)))
