"""A GPT made of stock torch modules only (``nn.Embedding``, ``nn.TransformerEncoderLayer``,
``nn.LayerNorm``, ``nn.Linear``), the shapes of a colossal_models ``GPTConfig``: what a user who
does not write their model with this project's layers brings to Gemini or FSDP2."""

from __future__ import annotations

import torch
from torch import nn

from colossal_models import GPTConfig


class StockGPT(nn.Module):
    """Pre-norm causal decoder of ``nn.TransformerEncoderLayer`` blocks (GELU, no dropout) and an
    untied head; ``forward(x, y)`` returns the mean cross-entropy, as ``colossal_models.GPT``."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        h = cfg.hidden_size
        self.tok = nn.Embedding(cfg.vocab_size, h)
        self.pos = nn.Embedding(cfg.max_seq_len, h)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(
                h,
                cfg.num_heads,
                dim_feedforward=cfg.ffn_hidden_size or 4 * h,
                dropout=0.0,
                activation="gelu",
                batch_first=True,
                norm_first=True,
            )
            for _ in range(cfg.num_layers)
        )
        self.ln_f = nn.LayerNorm(h)
        self.head = nn.Linear(h, cfg.vocab_size, bias=False)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=x.device)
        h = self.tok(x) + self.pos(torch.arange(t, device=x.device))
        for block in self.blocks:
            h = block(h, src_mask=mask, is_causal=True)
        logits = self.head(self.ln_f(h))
        return nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())
