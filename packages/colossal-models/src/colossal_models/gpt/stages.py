"""Pipeline stage of ``GPT``: the embedding on the first stage, a run of blocks on every stage,
the final norm and the tied head (with the loss) on the last; built by ``split_into_stages``."""

from __future__ import annotations

import torch
from torch import nn

from .model import GPT, embed_with, head_with

__all__ = ["GPTStage"]


class GPTStage(nn.Module):
    """Blocks ``layers`` of ``model`` (kept under their names ``blocks.<i>``), plus ``wte``,
    ``wpe`` and ``drop`` when ``first`` and ``ln_f`` and ``wte`` (the tied head) when ``last``.

    ``forward(ids)`` on the first stage, ``forward(x)`` in the middle, ``forward(x, targets)``
    (the mean loss) on the last; parameter names are those of the whole model.
    """

    def __init__(self, model: GPT, layers: range, *, first: bool, last: bool) -> None:
        super().__init__()
        self.config, self.io = model.config, model.io
        self.first, self.last = first, last
        if first:
            self.wpe, self.drop = model.wpe, model.drop
        if first or last:
            self.wte = model.wte  # the last stage's copy lives on another rank: tied by grads
        if last:
            self.ln_f = model.ln_f
        self.blocks = nn.ModuleDict({str(i): model.blocks[i] for i in layers})

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        if self.first:
            x = embed_with(self, x)
        for block in self.blocks.values():
            x = block(x)
        return head_with(self, x, targets) if self.last else x
