"""Which combinations of parallelism, sharding, precision, recomputation and lazy init build.

[Note: capability table] One table, ``REFUSED``, lists what the runtime does not build today;
every combination it does not name builds. The plugins' constructor checks
(``HybridParallelPlugin``, ``GeminiPlugin``, ``LowLevelZeroPlugin``), the training job's flag
checks (``colossal.train``) and ``colossal plan``'s enumeration of candidates all ask
``check_combination`` / ``builds``, so none of them can accept what another refuses. Widening
what builds (a composition made to work) is deleting its row here; the tests that compare the
table with the plugins and the planner then cover the new cells. Sizes (a tp that is not q*q, a
world that tp*pp*sp does not divide, more stages than blocks) are not kinds and stay with the
mesh checks.

A refused combination is reported with the nearest one that builds: the fewest fields changed,
changing precision, recomputation and lazy init before the sharding, and the sharding before a
parallel axis (see ``_COST``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

import numpy as np

from colossal_contracts import ConfigError

__all__ = [
    "PP_SCHEDULES",
    "PRECISIONS",
    "REFUSED",
    "SHARDINGS",
    "SP_KINDS",
    "TP_KINDS",
    "Combination",
    "Refusal",
    "builds",
    "check_combination",
    "long_sequence",
    "megatron_sequence",
    "nearest",
    "refusal",
    "table_precision",
]

TP_KINDS = ("none", "1d", "2d", "2.5d", "3d")  # none: tp_size 1
# megatron: over the 1d tp ranks; "ring+megatron": ring over sp ranks, and each sp rank's slice
# split again over its 1d tp ranks between the attention and MLP blocks
SP_KINDS = ("none", "megatron", "ring", "ulysses", "ring+megatron", "ulysses+megatron")
PP_SCHEDULES = ("none", "1f1b", "interleaved", "gpipe")  # none: one stage
SHARDINGS = ("zero0", "zero1", "zero2", "gemini")  # gemini: ZeRO-3 over chunks
PRECISIONS = ("fp32", "bf16", "fp16")


def table_precision(precision: str) -> str:
    """The table's name for a plugin's precision: "fp64" (float64 throughout, no masters or
    loss scaling: colossal-zero's [Note: fp64 precision]) composes as fp32 does, so it is looked
    up as "fp32"; every other name is its own."""
    return "fp32" if precision == "fp64" else precision


def long_sequence(sp: str | None) -> Literal["ring", "ulysses"] | None:
    """The ring/Ulysses part of a sequence-parallel kind (``"ring+megatron"`` -> ``"ring"``)."""
    head = (sp or "none").split("+")[0]
    return "ring" if head == "ring" else "ulysses" if head == "ulysses" else None


def megatron_sequence(sp: str | None) -> bool:
    """Whether a sequence-parallel kind splits activations over the 1d tp ranks (Megatron's)."""
    return "megatron" in (sp or "").split("+")


@dataclass(frozen=True)
class Combination:
    """What a run composes, by kind (no sizes).

    Attributes:
        tp: tensor-parallel mode, "none" without tensor parallelism.
        sp: sequence parallelism: "megatron" (activations over the tp ranks), "ring" or
            "ulysses" (ranks of their own), both ("ring+megatron", "ulysses+megatron"), "none".
        pp: pipeline schedule, "none" with one stage.
        sharding: "zero0" (plain data parallelism), "zero1", "zero2" or "gemini".
        precision: "fp32", or mixed "bf16"/"fp16" with fp32 masters.
        checkpointing: activation checkpointing (whole blocks recomputed in backward).
        lazy: the model is built under ``colossal.lazy_init()`` (meta parameters).
        lora: LoRA adapters (``peft``) on a frozen base (``--lora-rank``).
    """

    tp: str = "none"
    sp: str = "none"
    pp: str = "none"
    sharding: str = "zero0"
    precision: str = "fp32"
    checkpointing: bool = False
    lazy: bool = False
    lora: bool = False

    def __post_init__(self) -> None:
        for name, allowed in _CHOICES.items():
            if getattr(self, name) not in allowed:
                raise ConfigError(
                    f"Combination.{name} must be one of {allowed}, got {getattr(self, name)!r}"
                )

    def describe(self) -> str:
        """One line, e.g. ``tp 1d + ring sp + pp 1f1b + zero1 + bf16 + checkpointing``."""
        parts = []
        if self.tp != "none":
            parts.append(f"tp {self.tp}")
        if self.sp != "none":
            long = long_sequence(self.sp)
            if long is not None:
                parts.append(f"{long} sp")
            if megatron_sequence(self.sp):
                parts.append("Megatron sp")
        if self.pp != "none":
            parts.append(f"pp {self.pp}")
        parts += [self.sharding, self.precision]
        if self.checkpointing:
            parts.append("activation checkpointing")
        if self.lazy:
            parts.append("lazy init")
        if self.lora:
            parts.append("LoRA")
        return " + ".join(parts)


_CHOICES: dict[str, tuple[object, ...]] = {
    "tp": TP_KINDS,
    "sp": SP_KINDS,
    "pp": PP_SCHEDULES,
    "sharding": SHARDINGS,
    "precision": PRECISIONS,
    "checkpointing": (False, True),
    "lazy": (False, True),
    "lora": (False, True),
}


@dataclass(frozen=True)
class Refusal:
    """One refused region: ``when`` holds for the combinations it covers; ``why`` says why."""

    when: Callable[[Combination], bool]
    why: str


# [Note: capability table] Each row is read off a refusal in the runtime (the plugin that would
# run it, or the job); delete a row when its composition is built and tested.
REFUSED: tuple[Refusal, ...] = (
    Refusal(
        lambda c: megatron_sequence(c.sp) and c.tp != "1d",
        "Megatron sequence parallelism splits activations over 1d tensor-parallel ranks",
    ),
    Refusal(
        lambda c: long_sequence(c.sp) is not None and c.tp not in ("none", "1d"),
        "ring/Ulysses sequence parallelism composes with 1d tensor parallelism only",
    ),
    Refusal(
        lambda c: c.pp != "none" and c.sharding == "gemini",
        "Gemini (ZeRO-3) takes --tp or ring/Ulysses --sp, not pipeline stages",
    ),
    Refusal(
        lambda c: c.sharding == "gemini" and megatron_sequence(c.sp),
        "Gemini (ZeRO-3) takes ring/Ulysses sequence parallelism, not Megatron's",
    ),
    Refusal(
        lambda c: c.sharding == "zero0" and c.precision != "fp32",
        "mixed precision needs the fp32 masters of ZeRO-1/2 or Gemini; plain data "
        "parallelism trains in fp32",
    ),
    Refusal(  # colossal.lora's [Note: LoRA under tp]: rules for 1d column and row layers
        lambda c: c.lora and (c.pp != "none" or c.sp != "none" or c.tp not in ("none", "1d")),
        "LoRA adapters are split beside 1d tensor-parallel layers only (no pipeline stages, "
        "sequence parallelism or grid tp modes yet)",
    ),
    Refusal(
        lambda c: c.lora and c.sharding == "gemini" and c.tp != "none",
        "LoRA with tensor parallelism runs on the hybrid plugin (ZeRO 0-2), not Gemini",
    ),
)

# What changing a field costs when looking for the nearest combination that builds.
_COST = {
    "precision": 1,
    "checkpointing": 1,
    "lazy": 1,
    "sharding": 2,
    "pp": 3,
    "sp": 3,
    "tp": 3,
    "lora": 9,  # the run's purpose: never the change proposed
}


def refusal(c: Combination) -> str | None:
    """Why ``c`` does not build (the first row of ``REFUSED`` that covers it); None if it does."""
    for row in REFUSED:
        if row.when(c):
            return row.why
    return None


def builds(c: Combination) -> bool:
    """Whether the runtime builds ``c`` (no row of ``REFUSED`` covers it)."""
    return refusal(c) is None


_NAMES = tuple(_CHOICES)


@lru_cache(maxsize=1)
def _buildable() -> tuple[np.ndarray, tuple[Combination, ...]]:
    """Every combination that builds, and the indices of its choices (one row each)."""
    idx, found = [], []
    for values in itertools.product(*(_CHOICES[n] for n in _NAMES)):
        choice: dict[str, Any] = dict(zip(_NAMES, values))  # the fields' kinds and flags
        cand = Combination(**choice)
        if builds(cand):
            idx.append([_CHOICES[n].index(v) for n, v in zip(_NAMES, values)])
            found.append(cand)
    return np.array(idx, dtype=np.int64).reshape(-1, len(_NAMES)), tuple(found)


@lru_cache(maxsize=2)
def _buildable_with(lora: bool) -> tuple[np.ndarray, tuple[Combination, ...]]:
    """``_buildable``'s rows whose ``lora`` is ``lora``."""
    idx, found = _buildable()
    keep = [i for i, cand in enumerate(found) if cand.lora == lora]
    return idx[keep], tuple(found[i] for i in keep)


@lru_cache(maxsize=4096)
def nearest(c: Combination) -> Combination | None:
    """The combination that builds with the least cost of changes from ``c`` (``c`` itself when
    it builds); ties go to the choices closest to ``c``'s in their tuples (``SHARDINGS`` etc.:
    zero2 is nearer zero1 than zero0), then to the earlier choices, in field order."""
    if builds(c):
        return c
    idx, found = _buildable_with(c.lora)  # LoRA is never the change proposed (``_COST``)
    if not found:
        return None
    here = np.array([_CHOICES[n].index(getattr(c, n)) for n in _NAMES], dtype=np.int64)
    cost = (idx != here) @ np.array([_COST[n] for n in _NAMES], dtype=np.int64)
    dist = np.abs(idx - here).sum(axis=1)
    # lexsort sorts by its last key first: cost, then distance, then each field's index
    order = np.lexsort((*(idx[:, i] for i in reversed(range(len(_NAMES)))), dist, cost))
    return found[int(order[0])]


def check_combination(c: Combination, *, what: str = "") -> None:
    """``ConfigError`` naming why ``c`` does not build and the nearest combination that does.
    ``what`` names the caller's spelling of ``c`` (flags, plugin settings) for the message."""
    why = refusal(c)
    if why is None:
        return
    near = nearest(c)
    fix = f"; the nearest that builds: {near.describe()}" if near is not None else ""
    raise ConfigError(f"{what or c.describe()} does not build: {why}{fix}")
