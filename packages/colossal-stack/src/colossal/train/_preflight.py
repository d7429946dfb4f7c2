"""Will it fit? A pre-flight memory estimate of a run, before the model is built.

[Note: pre-flight estimate] Weights, gradients and AdamW's two states take 16 bytes per parameter
in fp32 (Gemini's low-precision copies are within that: 2 + 2 + 4 master + 8 states); Gemini
shards them over the data-parallel ranks, DDP replicates them. Activations come from memtrace's
static estimate of one step on the meta device (no memory allocated), run only when the cheap
part is already a large share of what is free. All ranks of this machine draw from its host
memory. When the total passes the available memory the run is refused with the figure and the
largest preset (or batch size) that would fit, instead of an allocator error minutes later.

[Note: tier room] Under Gemini the model states are chunks that live in any tier, so the check
counts them with the planner's bytes per parameter (``colossal_zero.model_state_bytes_per_param``
at ZeRO-3 with gradients in parameter slots, plus fp32's 4-byte gradient chunks; 16 bytes in fp32,
14 in bf16) against the room of all tiers: host (``--host-budget``, at most what is free), disk
(``--disk-budget``) and, on a real accelerator, ``--accelerator-budget``. A run is refused only
when none of them together hold the states. A host budget above the machine's RAM is refused
first (the disk directory is checked with the configuration: missing, read-only, full, or a
budget above its free space). What the disk and a real accelerator do not hold stays in host
memory (``gemini_host_bytes``); ``check_fits`` then counts that share, with the step's
activations, against what the host has free, so a model larger than the RAM is refused only
when its disk budget does not take the rest. The job builds the model lazily ([Note: lazy
job]), so its setup never holds the whole model on the host either.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import psutil
import torch
from torch import nn

from colossal_contracts import ConfigError
from colossal_memtrace import estimate_step
from colossal_zero import model_state_bytes_per_param

__all__ = [
    "BYTES_PER_PARAM",
    "check_fits",
    "check_tiers",
    "gemini_host_bytes",
    "gemini_state_bytes",
    "host_bytes_available",
]

BYTES_PER_PARAM = 16  # fp32 weight + gradient + AdamW exp_avg + exp_avg_sq


def host_bytes_available() -> int:
    return int(psutil.virtual_memory().available)


def _gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB"


def _state_bytes(num_params: int, *, sharded: bool, world: int, local: int) -> int:
    per_rank = BYTES_PER_PARAM * num_params // (world if sharded else 1)
    return per_rank * local


def gemini_state_bytes(num_params: int, *, precision: str, world: int, local: int) -> int:
    """This machine's bytes of Gemini's model states (see [Note: tier room])."""
    p, g, o = model_state_bytes_per_param(3, world, grads_in_param_slots=True)
    per_param = p + g + o if precision != "fp32" else 2 * p + 4 / world + o * 8 / 12
    return int(per_param * num_params) * local


def gemini_host_bytes(states: int, *, disk_bytes: int, accelerator_bytes: int | None = None) -> int:
    """This machine's share of Gemini's ``states`` (``gemini_state_bytes``) left in host memory
    once the disk tier and a real accelerator hold what their budgets take ([Note: tier room];
    an emulated accelerator is host memory)."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    acc = (accelerator_bytes or 0) * local if torch.cuda.is_available() else 0
    return max(0, states - disk_bytes * local - acc)


def check_tiers(
    *,
    num_params: int,
    label: str,
    precision: str,
    world: int,
    host_bytes: int | None,
    disk_bytes: int,
    accelerator_bytes: int | None = None,
    available: int | None = None,
    total: int | None = None,
) -> int:
    """[Note: tier room]: Gemini's state bytes on this machine; ``ConfigError`` (one line) when
    ``host_bytes`` exceeds the RAM or no tier room holds the states."""
    total = int(psutil.virtual_memory().total) if total is None else total
    if host_bytes is not None and host_bytes > total:
        raise ConfigError(
            f"--host-budget {host_bytes:,} bytes is larger than this machine's RAM "
            f"({total:,} bytes); lower it to at most {total:,} (leave room for the process)"
        )
    available = host_bytes_available() if available is None else available
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    states = gemini_state_bytes(num_params, precision=precision, world=world, local=local)
    host = available if host_bytes is None else min(host_bytes * local, available)
    disk = disk_bytes * local  # 0: no disk tier; the job refuses None ([Note: budgets])
    acc = (accelerator_bytes or 0) * local if torch.cuda.is_available() else 0
    if states > host + disk + acc:
        more = states - host - acc
        raise ConfigError(
            f"{label} ({num_params:,} params) needs about {_gib(states)} for Gemini's weights, "
            f"gradients and AdamW states ({precision}), and the tiers hold {_gib(host)} on the "
            f"host, {_gib(disk)} on disk{f', {_gib(acc)} on the accelerator' if acc else ''}; "
            f"give the disk tier room: --disk-budget {-(-more // local):,} (bytes per process) or "
            "more, or a smaller --preset"
        )
    return states


def check_fits(
    *,
    build: Callable[[], nn.Module],
    num_params: int,
    label: str,
    presets: dict[str, Any],
    batch_size: int,
    seq_len: int,
    sharded: bool,
    world: int,
    available: int | None = None,
    states: int | None = None,
) -> int:
    """Estimated host bytes of the run on this machine; ``ConfigError`` naming the need and a
    setting that fits when it exceeds ``available`` (default: what the host has free).
    ``states``: this machine's host bytes of the model states (Gemini's: ``gemini_host_bytes``);
    None: 16 per parameter (sharded over ``world`` or not)."""
    available = host_bytes_available() if available is None else available
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if states is None:
        states = _state_bytes(num_params, sharded=sharded, world=world, local=local)
    if states > available:
        smaller = [
            name
            for name, cfg in sorted(presets.items(), key=lambda kv: kv[1].num_params())
            if _state_bytes(cfg.num_params(), sharded=sharded, world=world, local=local)
            < available // 2
        ]
        hint = f"--preset {smaller[-1]} fits" if smaller else "no preset fits"
        raise ConfigError(
            f"{label} ({num_params:,} params) needs about {_gib(states)} of host memory for "
            f"weights, gradients and AdamW states alone, and {_gib(available)} is available; "
            f"{hint} (or spread it over more machines with --plugin gemini)"
        )
    if states < available // 4 and batch_size * seq_len <= 1 << 16:
        return states  # activations of such a step are small next to what is free
    shape = (batch_size, seq_len)
    try:
        est = estimate_step(
            build,
            lambda dev: (torch.zeros(shape, dtype=torch.long, device=dev),) * 2,
            target="cpu",
        )
    except RuntimeError as err:  # a forward that reads values (HF's packed-sequence mask)
        if "meta tensors" not in str(err):
            raise
        return states  # its activations cannot be traced on meta: the states alone are checked
    acts = est.peak_non_model("accelerator") * local
    if states + acts > available:
        room = available - states
        fit = max(0, int(batch_size * room / max(1, acts)) - 1)
        hint = f"--batch-size {fit} fits" if fit >= 1 else "a smaller --preset or --seq-len"
        raise ConfigError(
            f"{label} with --batch-size {batch_size} x --seq-len {seq_len} needs about "
            f"{_gib(states + acts)} of host memory ({_gib(acts)} activations), and "
            f"{_gib(available)} is available; {hint}"
        )
    return states + acts
