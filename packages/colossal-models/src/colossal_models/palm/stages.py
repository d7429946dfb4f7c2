"""Pipeline stage of ``PaLM``: the embedding on the first stage, a run of blocks on every stage,
the final norm and the head (tied or not, with the loss) on the last."""

from __future__ import annotations

import torch
from torch import nn

from .model import PaLM, embed_with, head_with, rotary_with

__all__ = ["PaLMStage"]


class PaLMStage(nn.Module):
    """Blocks ``layers`` of ``model`` (kept under their names ``blocks.<i>``), plus ``wte`` when
    ``first`` and ``ln_f`` with the head (``lm_head``, or ``wte`` when tied) when ``last``.

    ``seq_parts`` is how many ranks share the sequence of the activation between stages (the
    tensor-parallel size under Megatron sequence parallelism, else 1): the rotary tables of a
    middle stage cover ``seq_parts`` times its activation's length.
    """

    def __init__(
        self, model: PaLM, layers: range, *, first: bool, last: bool, seq_parts: int = 1
    ) -> None:
        super().__init__()
        self.config, self.io = model.config, model.io
        self.first, self.last, self.seq_parts = first, last, seq_parts
        if first or (last and model.lm_head is None):
            self.wte = model.wte
        if last:
            self.ln_f, self.lm_head = model.ln_f, model.lm_head
        self.blocks = nn.ModuleDict({str(i): model.blocks[i] for i in layers})

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        if self.first:
            seq_len = x.shape[1]
            x = embed_with(self, x)
        else:
            seq_len = x.shape[1] * self.seq_parts
        cos, sin = rotary_with(self, seq_len, x)
        for block in self.blocks.values():
            x = block(x, cos, sin)
        return head_with(self, x, targets) if self.last else x
