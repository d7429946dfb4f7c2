"""Streamed Gemini checkpoints: save -> load -> save round trips are bit-identical across
data-parallel sizes and tiers (every saved value: weights, both Adam moments, step counts), and
the streamed full state equals the gathered one."""

from __future__ import annotations

import _checks_ckpt as checks
import pytest
import torch
from test_gemini import BATCH

from colossal_zero import GeminiConfig, consolidate
from colossal_zero.checkpoint._reader import CheckpointReader

KINDS = ("param", "exp_avg", "exp_avg_sq")


def _saved(directory) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """Every value a checkpoint holds, whole: ``kind/name`` -> flat tensor, ``step/name``."""
    reader = CheckpointReader(directory)
    out: dict[str, object] = {}
    for name, meta in reader.index["params"].items():
        numel = int(torch.Size(meta["shape"]).numel())
        for kind in KINDS:
            out[f"{kind}/{name}"] = reader.read(kind, name, 0, numel)
        out[f"step/{name}"] = reader.step(name)
    return out


def _same_values(a: dict[str, object], b: dict[str, object]) -> bool:
    return set(a) == set(b) and all(
        torch.equal(v, b[k]) if isinstance(v, torch.Tensor) else v == b[k] for k, v in a.items()
    )


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return set(a) == set(b) and all(torch.equal(a[n], b[n]) for n in a)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_round_trip_is_bit_identical_across_dp_sizes_and_the_disk_tier(world, tmp_path, precision):
    cfg = GeminiConfig(precision=precision, accelerator_bytes=220_000, chunk_numel=8192)
    on_disk = GeminiConfig(
        precision=precision,
        accelerator_bytes=220_000,
        host_bytes=0,  # every chunk that leaves the accelerator lives in a file
        disk_bytes=None,
        disk_dir=tmp_path / "tier",
        chunk_numel=8192,
    )
    (tmp_path / "tier").mkdir()
    two, one, disk, back = (tmp_path / d for d in ("dp2", "dp1", "disk", "dp2-again"))
    for d in (two, one, disk, back):
        d.mkdir()
    full, streamed, most, chunks = world(2).run(checks.train_and_save, cfg, str(two), 3, BATCH)[0]
    assert _equal(streamed, full)  # the same values and names,
    assert chunks > 2 and most == 1  # one gathered chunk alive at a time (buffers: no chunk)
    assert _equal(checks.load_and_save(cfg, str(two), str(one))[0], full)  # dp2 -> dp1
    from_disk, disk_bytes = checks.load_and_save(on_disk, str(one), str(disk))
    assert disk_bytes > 0 and _equal(from_disk, full)  # chunks in files read and written
    world(2).run(checks.load_and_save, cfg, str(disk), str(back))
    want = _saved(two)
    assert all(v is not None for v in want.values())  # the optimizer's states were saved
    for d in (one, disk, back):  # dp1, the disk tier, dp1 (from disk) -> dp2
        assert _same_values(_saved(d), want)
    assert _equal(consolidate(back), consolidate(two))
