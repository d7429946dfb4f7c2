"""What ``test_budget_repeats`` runs on each rank of a 4-rank world: a Gemini job of GPT nano
under a budget too small to train, then the budget its refusal names, again and again."""

from __future__ import annotations

import re
from pathlib import Path

import torch.distributed as dist

from colossal.train import TrainConfig, train
from colossal_contracts import CapacityError


def _job(root: Path, name: str, budget: str) -> TrainConfig:
    corpus = root / "corpus.txt"
    if dist.get_rank() == 0 and not corpus.exists():
        corpus.write_text("the quick brown fox jumps over the lazy dog. " * 400)
    dist.barrier()
    return TrainConfig.from_flags(
        preset="nano",
        steps=2,  # the warmup step, then one planned under the budget
        batch_size=1,
        seq_len=16,
        corpus=corpus,
        out=root / name,
        export="none",
        plugin="gemini",
        accelerator_budget=budget,
    )


def smallest_budget_repeats(root: str, repeats: int) -> tuple[int, list[str]]:
    """The budget a too-small run names, and what each of ``repeats`` runs at it ended with
    ("trained" or the error's first line)."""
    try:
        train(_job(Path(root), "too-small", "440KiB"))
        raise AssertionError("440 KiB trained GPT nano on 4 ranks")
    except CapacityError as err:
        found = re.search(r"accelerator budget to at least ([\d,]+) bytes", str(err))
        assert found, str(err)
        named = int(found.group(1).replace(",", ""))
    ends = []
    for i in range(repeats):
        try:
            train(_job(Path(root), f"repeat-{i}", str(named)))
            ends.append("trained")
        except CapacityError as err:
            ends.append(str(err).splitlines()[0])
    return named, ends


def warmup_budget_trains_or_names_once(root: str) -> list[str]:
    """A budget GPT nano's warmup cannot hold at its first chunk size (900 KiB on 4 ranks): the
    warmup borrows ([Note: warmup loan]); what each run ended with, following a refusal once."""
    ends, budget = [], "900KiB"
    for i in range(2):
        try:
            train(_job(Path(root), f"warmup-{i}", budget))
            return [*ends, "trained"]
        except CapacityError as err:
            ends.append(str(err))
            found = re.search(r"accelerator budget to at least ([\d,]+) bytes", str(err))
            if found is None:
                return ends
            budget = found.group(1).replace(",", "")
    return ends
