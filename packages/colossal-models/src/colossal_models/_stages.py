"""``split_into_stages``: this rank's pipeline stages of a GPT or PaLM, for ``run_pipeline``.

Every rank builds (and, for tensor parallelism inside a stage, ``parallelize``s) the whole model
with the same seed, then keeps the virtual stages its ``pp`` coordinate holds
([Note: stage order] in colossal_parallel). Blocks are split by count, or balanced by a cost per
block. The first stage embeds, the last normalises, projects and takes the loss. A tied output
head is the embedding of the last rank's own model copy, kept equal to the first rank's by
``run_pipeline`` summing the two gradients ([Note: tied parameters]).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from torch import nn

from colossal_contracts import ConfigError
from colossal_parallel import ProcessMesh
from colossal_parallel.pipeline import parameter_costs, partition_layers, stage_rank

from ._long_seq import SequenceIO
from ._tp._grid import GridIO
from ._tp._layers1d import IO1D
from .gpt.model import GPT
from .gpt.stages import GPTStage
from .palm.model import PaLM
from .palm.stages import PaLMStage

__all__ = ["PipelineStages", "split_into_stages"]


@dataclass
class PipelineStages:
    """This rank's share of a pipelined model.

    Attributes:
        chunks: virtual stages ``c * pp + coord("pp")`` for ``c`` in ``0..v-1``.
        layers: the block indices of each chunk.
        tied: parameters shared by the first and last stage, on the ranks holding those.
        hidden_size: width of the activation passed between stages.
        seq_parts: ranks sharing that activation's sequence (Megatron sequence parallelism,
            ring or Ulysses).
        batch_parts, hidden_parts: ranks sharing its batch and its hidden dim (the grid tensor-
            parallel modes' activation layout, [Note: activation layout]).
    """

    chunks: list[nn.Module]
    layers: list[range]
    tied: list[nn.Parameter]
    hidden_size: int
    seq_parts: int
    batch_parts: int = 1
    hidden_parts: int = 1

    def boundary_shape(self, micro_batch: int, seq_len: int) -> tuple[int, int, int]:
        """Shape of one micro-batch's activation between stages on this rank:
        ``(b / batch_parts, T / seq_parts, C / hidden_parts)``."""
        if micro_batch % self.batch_parts:
            raise ConfigError(
                f"a micro-batch of {micro_batch} cannot be split over the {self.batch_parts} "
                "batch ranks of the grid tensor-parallel layout; use a micro-batch size that is "
                f"a multiple of {self.batch_parts}"
            )
        return (
            micro_batch // self.batch_parts,
            seq_len // self.seq_parts,
            self.hidden_size // self.hidden_parts,
        )

    def parameters(self) -> list[nn.Parameter]:
        """Every parameter of the chunks, once each (chunks on one rank may share the head)."""
        seen: dict[int, nn.Parameter] = {}
        for chunk in self.chunks:
            for q in chunk.parameters():
                seen.setdefault(id(q), q)
        return list(seen.values())


def split_into_stages(
    model: nn.Module,
    mesh: ProcessMesh,
    *,
    num_virtual: int = 1,
    costs: Literal["count", "parameters"] | Sequence[float] = "count",
) -> PipelineStages:
    """This rank's stages of ``model`` (a ``GPT`` or ``PaLM``, sharded or not) over ``pp``.

    ``num_virtual`` chunks per rank (interleaved schedule); ``costs`` balances the blocks: by
    count, by parameter bytes, or by one figure per block (a traced time or memory). Raises
    ``ConfigError`` (before any collective) when there are more stages than blocks or when the
    model's blocks cannot be split as asked. Stages compose with every tensor-parallel mode:
    with a grid mode the activation between stages keeps its layout (batch and hidden split).
    """
    if not isinstance(model, (GPT, PaLM)):
        raise ConfigError(
            f"split_into_stages knows GPT and PaLM, got {type(model).__name__}; for other models "
            "build stage modules and call colossal_parallel.pipeline.run_pipeline directly"
        )
    p, me = mesh.size("pp"), mesh.coord("pp")
    num_stages = p * num_virtual
    blocks = list(model.blocks)
    if costs == "count":
        runs = partition_layers(len(blocks), num_stages)
    elif costs == "parameters":
        runs = partition_layers(len(blocks), num_stages, parameter_costs(blocks))
    else:
        runs = partition_layers(len(blocks), num_stages, list(costs))
    sp_io = isinstance(model.io, IO1D) and model.io.sequence_parallel
    seq_parts = mesh.size("tp") if sp_io else 1
    if isinstance(model.io, SequenceIO):  # ring or Ulysses: each rank holds T / sp tokens
        inner = model.io.inner  # with Megatron's split too: T / (sp * tp)
        megatron = isinstance(inner, IO1D) and inner.sequence_parallel
        seq_parts = mesh.size("sp") * (mesh.size("tp") if megatron else 1)
    batch_parts = hidden_parts = 1
    if isinstance(model.io, GridIO):  # [Note: activation layout]: batch and hidden split
        layout = model.io.layout
        batch_parts = math.prod(mesh.size(a) for a in layout.row_axes)
        hidden_parts = mesh.size(layout.hidden_axis)
    mine = [s for s in range(num_stages) if stage_rank(s, p)[0] == me]
    chunks: list[nn.Module] = []
    for s in mine:
        first, last = s == 0, s == num_stages - 1
        if isinstance(model, GPT):
            chunks.append(GPTStage(model, runs[s], first=first, last=last))
        else:
            chunks.append(PaLMStage(model, runs[s], first=first, last=last, seq_parts=seq_parts))
    tied_head = isinstance(model, GPT) or model.lm_head is None
    tied = [model.wte.weight] if p > 1 and tied_head and me in (0, p - 1) else []
    return PipelineStages(
        chunks=chunks,
        layers=[runs[s] for s in mine],
        tied=tied,
        hidden_size=model.config.hidden_size,
        seq_parts=seq_parts,
        batch_parts=batch_parts,
        hidden_parts=hidden_parts,
    )
