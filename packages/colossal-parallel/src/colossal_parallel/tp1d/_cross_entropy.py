"""Vocabulary-parallel LM head and cross-entropy: the logits are never gathered.

The head is a column-parallel linear over the vocabulary (rank ``c`` computes logits
``[c*V/p, (c+1)*V/p)``). The loss needs, per token, the max logit, the sum of exponentials and the
target's logit; each is a reduction over the vocabulary, so three all-reduces of one value per
token replace an all-gather of ``V`` values per token. The gradient ``softmax - onehot`` is local.
"""

from __future__ import annotations

from typing import Any, Literal

import torch

from colossal_contracts import ConfigError

from .._comm import CountedComm
from .._mesh import ProcessMesh
from ._base import Layer1D
from ._embedding import VocabParallelEmbedding
from ._linear import ColumnParallelLinear

__all__ = ["VocabParallelCrossEntropy", "VocabParallelLMHead", "vocab_parallel_cross_entropy"]

Reduction = Literal["mean", "sum", "none"]


class _VocabParallelCE(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        logits: torch.Tensor,  # (N, V/p), this rank's vocabulary slice
        target: torch.Tensor,  # (N,), global ids; ignored tokens already mapped outside
        comm: CountedComm,
        axis: str,
    ) -> torch.Tensor:
        v = logits.shape[-1]
        start = comm.coord(axis) * v
        x = logits.to(torch.promote_types(logits.dtype, torch.float32))
        gmax = comm.all_reduce(x.max(dim=-1).values, axis, op=torch.distributed.ReduceOp.MAX)
        x = x - gmax.unsqueeze(-1)  # (N, V/p)
        inside = (target >= start) & (target < start + v)
        local = (target - start).masked_fill(~inside, 0)
        picked = x.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(~inside, 0.0)
        picked = comm.all_reduce(picked, axis)  # (N,) target logit minus max
        exp = x.exp()
        sumexp = comm.all_reduce(exp.sum(dim=-1), axis)  # (N,)
        loss = sumexp.log() - picked  # (N,)
        ctx.save_for_backward(exp.div_(sumexp.unsqueeze(-1)), inside, local)
        ctx.logits_dtype = logits.dtype
        return loss

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:
        softmax, inside, local = ctx.saved_tensors
        grad = softmax.clone()  # (N, V/p)
        rows = torch.arange(grad.shape[0], device=grad.device)
        grad[rows, local] -= inside.to(grad.dtype)
        grad.mul_(g.unsqueeze(-1))
        return grad.to(ctx.logits_dtype), None, None, None


def vocab_parallel_cross_entropy(
    logits: torch.Tensor,
    target: torch.Tensor,
    mesh: ProcessMesh,
    *,
    axis: str = "tp",
    ignore_index: int = -100,
    reduction: Reduction = "mean",
) -> torch.Tensor:
    """Cross-entropy of vocabulary-split ``logits (..., V/p)`` against global ``target (...)``.

    Equals ``F.cross_entropy`` of the gathered logits (reductions "mean", "sum", "none"); tokens
    whose target is ``ignore_index`` contribute nothing. Communication: three all-reduces of one
    fp32 value per token along ``axis``, forward only.
    """
    if reduction not in ("mean", "sum", "none"):
        raise ConfigError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    if logits.shape[:-1] != target.shape:
        raise ConfigError(
            f"logits {tuple(logits.shape)} and target {tuple(target.shape)} disagree: logits must "
            "be (..., V/p) with target (...)"
        )
    valid = target != ignore_index
    flat_t = target.masked_fill(~valid, -1).reshape(-1)  # -1 is outside every rank's range
    loss = _VocabParallelCE.apply(logits.reshape(-1, logits.shape[-1]), flat_t, mesh.comm, axis)
    loss = loss.reshape(target.shape) * valid
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / valid.sum().clamp(min=1)


class VocabParallelCrossEntropy(Layer1D):
    """Module form of ``vocab_parallel_cross_entropy``."""

    def __init__(
        self,
        mesh: ProcessMesh,
        *,
        axis: str = "tp",
        ignore_index: int = -100,
        reduction: Reduction = "mean",
    ) -> None:
        super().__init__(mesh, axis)
        self.ignore_index, self.reduction = ignore_index, reduction

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return vocab_parallel_cross_entropy(
            logits,
            target,
            self.mesh,
            axis=self.axis,
            ignore_index=self.ignore_index,
            reduction=self.reduction,
        )


class VocabParallelLMHead(ColumnParallelLinear):
    """The LM classifier ``hidden -> vocab`` split along the vocabulary; logits stay split.

    Build it from an unsharded head with ``from_linear``, or tie it to a
    ``VocabParallelEmbedding`` (same vocabulary split) with ``tied_to``.
    """

    @classmethod
    def tied_to(
        cls, embedding: VocabParallelEmbedding, *, sequence_parallel: bool = False, seq_dim: int = 1
    ) -> VocabParallelLMHead:
        """A bias-free head that shares ``embedding.weight`` (the tied-embedding GPT head)."""
        head = cls(
            embedding.embedding_dim,
            embedding.num_embeddings,
            embedding.mesh,
            bias=False,
            sequence_parallel=sequence_parallel,
            seq_dim=seq_dim,
            axis=embedding.axis,
            dtype=embedding.weight.dtype,
            device=embedding.weight.device,
        )
        head.weight = embedding.weight
        return head
