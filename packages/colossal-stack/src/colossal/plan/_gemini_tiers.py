"""Where Gemini's tiers put one rank's chunks when the parameters live off the accelerator
(``gemini-host-all``, ``gemini-disk``), by the runtime's own rules.

[Note: gemini tiers] Chunks start on the host ([Note: chunk residency] in colossal-chunk: the
home tier) in the order they are made: the parameter chunks, then per trainable chunk its fp32
twin (fp32: the gradient chunk; bf16: the master), then Adam's ``exp_avg`` and ``exp_avg_sq``.
A chunk that does not fit the host budget ``H`` goes to disk, and a later, smaller one may still
fit the host. With a disk tier, ``H`` also holds the read-ahead window ``W``
(``colossal_zero.read_ahead_bytes``, colossal-chunk's [Note: read-ahead window]): payloads fit
in ``H - W``, and the disk pages read ahead (at most ``W``, at most what is on disk) are host
memory too. Nothing moves a state back up from disk (the job keeps the states where they
started: ``--states-placement host``).

At the step's peak (the start of backward) the chunks in flight (``GATHERED_IN_FLIGHT``: in use,
kept for the next moment, gathered ahead; fewer when the model has fewer chunks) are on the
accelerator: each its gathered buffer and its parameter shard, moved there from the host (from
disk when the host holds no parameter shard). No gradient has arrived yet, so no gradient shard
is there ([Note: gradients in chunks] in colossal-zero). A spare payload of one parameter shard
stays on the host beside the tier's books ([Note: spare payloads]). The runtime also caches
chunks on the accelerator where its budget (twice the plan) has room: the bytes it caches leave
the host, so the sum over tiers is what the plan says, the split may lean to the accelerator.

``gemini-disk``'s host budget is ``tier_budget`` of the parameter shards and fp32 gradients
(bytes that must be on the host), at least what holds them beside ``W``, capped at the host
memory one device's job may use; the optimizer states fill what is left, then spill to disk.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from colossal_zero import GeminiConfig, read_ahead_bytes

from ._gemini import GeminiBytes, tier_budget

__all__ = ["TierBytes", "disk_host_budget", "gemini_tiers", "registration_order"]

_FLOOR_ITERATIONS = 8  # W grows with H by whole shards, at most four: a few rounds settle it


@dataclass(frozen=True)
class TierBytes:
    """One rank's Gemini model bytes per tier at the step's peak (see [Note: gemini tiers]).

    Attributes:
        device: on the accelerator: the gathered buffers and parameter shards in flight.
        host: payloads on the host, the disk pages read ahead, the spare payload.
        disk: payloads on disk.
        read_ahead: the part of ``host`` that is disk pages read ahead (the disk payloads'
            own pages: a live-tensor count sees them as ``disk``).
        host_budget: the host tier's budget (``--host-budget``); 0 without one.
    """

    device: float
    host: float
    disk: float
    read_ahead: float = 0.0
    host_budget: float = 0.0


def _shards(gem: GeminiBytes, dp: int, precision: str) -> tuple[float, float, float]:
    """(trainable parameter shard, frozen parameter shard, fp32 shard) bytes of one rank."""
    w = 4 if precision == "fp32" else 2
    return gem.chunk_numel / dp * w, gem.frozen_chunk_numel / dp * w, gem.chunk_numel / dp * 4


def registration_order(gem: GeminiBytes, dp: int, precision: str) -> list[tuple[str, float]]:
    """One rank's shards as the runtime makes them, (kind, bytes) in order: parameters (the
    frozen base first), then per trainable chunk its fp32 twin, ``exp_avg``, ``exp_avg_sq``."""
    shard, frozen_shard, fp32 = _shards(gem, dp, precision)
    trainable = gem.num_chunks - gem.frozen_chunks
    out = [("param", frozen_shard)] * gem.frozen_chunks + [("param", shard)] * trainable
    twin = "grad" if precision == "fp32" else "master"
    for kind in (twin, "exp_avg", "exp_avg_sq"):
        out += [(kind, fp32)] * trainable
    return out


def _window(gem: GeminiBytes, dp: int, host: int) -> int:
    """The runtime's W for a host budget of ``host`` bytes with a disk tier behind it."""
    cfg = GeminiConfig(host_bytes=host, disk_bytes=None)
    frozen = gem.frozen_chunk_numel or None
    return read_ahead_bytes(cfg, max(1, gem.chunk_numel), dp, frozen_chunk_numel=frozen)


def disk_host_budget(gem: GeminiBytes, dp: int, *, host_memory: float | None) -> int:
    """``gemini-disk``'s host budget (see the note): room for the parameters and fp32 gradients
    beside the read-ahead window, twice that with ``tier_budget``'s floor, within
    ``host_memory`` (never below the room that holds them)."""
    need = gem.params + gem.grads
    floor = int(need)
    for _ in range(_FLOOR_ITERATIONS):  # the smallest H with H - W(H) >= need
        nxt = int(need) + _window(gem, dp, floor)
        if nxt == floor:
            break
        floor = nxt
    budget = tier_budget(need)
    if host_memory is not None:
        budget = min(budget, max(floor, int(host_memory)))
    return max(budget, floor)


def gemini_tiers(
    gem: GeminiBytes, dp: int, precision: str, *, host_budget: int | None
) -> TierBytes:
    """Per-tier bytes of [Note: gemini tiers] with every chunk starting on the host, under a
    host budget of ``host_budget`` bytes with a disk tier behind it (None: no budget, no disk:
    ``gemini-host-all``)."""
    window = 0 if host_budget is None else _window(gem, dp, host_budget)
    room = math.inf if host_budget is None else host_budget - window
    on_host = on_disk = params_on_host = 0.0
    for kind, nbytes in registration_order(gem, dp, precision):
        if on_host + nbytes <= room:
            on_host += nbytes
            params_on_host += nbytes if kind == "param" else 0.0
        else:
            on_disk += nbytes
    in_flight = gem.in_flight
    from_host = min(in_flight, params_on_host)
    read_ahead = float(min(window, on_disk - (in_flight - from_host)))
    return TierBytes(
        device=gem.gathered + in_flight,
        host=on_host - from_host + read_ahead + gem.spare,
        disk=on_disk - (in_flight - from_host),
        read_ahead=read_ahead,
        host_budget=float(host_budget or 0),
    )
