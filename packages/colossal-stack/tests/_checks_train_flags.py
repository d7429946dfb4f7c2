"""Rank side of ``test_train_flags.py``: runs of ``colossal.train.train`` and their final
weights, read back from the checkpoint in one process (``colossal.export``)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from colossal import TrainConfig, train
from colossal.export import iter_checkpoint_state, read_checkpoint


def final_weights(out: Any) -> dict[str, torch.Tensor]:
    """The checkpoint's full fp32 weights under the trained module's names."""
    return dict(iter_checkpoint_state(read_checkpoint(out)))


def run_all(runs: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """Each ``TrainConfig.from_flags(**kw)`` in turn; on rank 0 their losses, validation losses and
    final weights (None on the other ranks)."""
    out = []
    for kw in runs:
        result = train(TrainConfig.from_flags(**kw))
        out.append({"losses": result.losses, "val_loss": result.val_loss})
    if dist.is_initialized() and dist.get_rank() != 0:
        return None
    for rec, kw in zip(out, runs, strict=True):
        rec["weights"] = final_weights(kw["out"])
    return out
