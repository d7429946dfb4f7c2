"""Stage partitioning: contiguous runs of layers, by count or balanced by a per-layer cost.

[Note: stage order] Virtual stage ``s`` of ``p * v`` holds the ``s``-th run of layers; it lives on
the rank at ``pp`` coordinate ``s % p`` as that rank's chunk ``s // p`` (Megatron's interleaving:
with ``v = 1`` stage ``s`` is simply rank ``s``).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from torch import nn

from colossal_contracts import ConfigError

__all__ = ["parameter_costs", "partition_layers", "stage_rank"]


def stage_rank(stage: int, num_ranks: int) -> tuple[int, int]:
    """``(pp coordinate, chunk index)`` of virtual stage ``stage`` (see [Note: stage order])."""
    return stage % num_ranks, stage // num_ranks


def parameter_costs(layers: Sequence[nn.Module]) -> list[float]:
    """The parameter bytes of each layer: a cost for ``partition_layers``."""
    return [float(sum(p.numel() * p.element_size() for p in m.parameters())) for m in layers]


def _check(num_layers: int, num_stages: int) -> None:
    if num_stages < 1:
        raise ConfigError(f"the number of pipeline stages must be >= 1, got {num_stages}")
    if num_stages > num_layers:
        raise ConfigError(
            f"cannot split {num_layers} layers into {num_stages} pipeline stages (each stage "
            f"needs at least one layer); use pp * virtual stages <= {num_layers} or a deeper model"
        )


def partition_layers(
    num_layers: int, num_stages: int, costs: Sequence[float] | None = None
) -> list[range]:
    """Split layers ``0..num_layers-1`` into ``num_stages`` non-empty contiguous runs.

    Without ``costs`` the runs differ in length by at most one (earlier stages take the extra
    layers). With ``costs`` (one non-negative figure per layer: parameter bytes, a traced time or
    memory) the split minimises the largest per-stage sum, ties going to earlier boundaries.
    """
    _check(num_layers, num_stages)
    if costs is None:
        base, extra = divmod(num_layers, num_stages)
        bounds = [0]
        for s in range(num_stages):
            bounds.append(bounds[-1] + base + (1 if s < extra else 0))
        return [range(a, b) for a, b in itertools.pairwise(bounds)]
    if len(costs) != num_layers or any(c < 0 for c in costs):
        raise ConfigError(
            f"partition costs must be {num_layers} non-negative numbers (one per layer), "
            f"got {len(costs)} values"
        )
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + float(c))
    inf = float("inf")
    # best[k][i]: the least possible max stage cost of the first i layers in k stages.
    best = [[inf] * (num_layers + 1) for _ in range(num_stages + 1)]
    cut = [[0] * (num_layers + 1) for _ in range(num_stages + 1)]
    best[0][0] = 0.0
    for k in range(1, num_stages + 1):
        for i in range(k, num_layers - (num_stages - k) + 1):
            for j in range(k - 1, i):
                cand = max(best[k - 1][j], prefix[i] - prefix[j])
                if cand < best[k][i]:
                    best[k][i], cut[k][i] = cand, j
    bounds = [num_layers]
    for k in range(num_stages, 0, -1):
        bounds.append(cut[k][bounds[-1]])
    bounds.reverse()
    return [range(a, b) for a, b in itertools.pairwise(bounds)]
