"""Issue 35 item 2 with stock torch modules: ``nn.TransformerEncoderLayer``'s attention reads
parameters of three chunks in one moment. Whatever the budget, a Gemini run is either refused in
its warmup step (the feasibility rule, [Note: feasibility rule]) or trains every step with plain
AdamW's losses; before the rule's floor counted the gradient twins still filling in backward, a
budget between the moment's chunks and those plus one twin went on and failed in step 2."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from colossal_contracts import CapacityError
from colossal_zero import GeminiConfig, GeminiOptimizer, apply_gemini

VOCAB, SEQ, HIDDEN, STEPS = 64, 16, 64, 3
CHUNK = 4 * HIDDEN * HIDDEN  # the largest tensor (linear1), so chunks cannot be halved
CHUNK_BYTES = 4 * CHUNK


class _StockNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, HIDDEN)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(HIDDEN, 4, 4 * HIDDEN, dropout=0.0, batch_first=True)
            for _ in range(2)
        )
        self.head = nn.Linear(HIDDEN, VOCAB)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1])
        h = self.tok(x)
        for b in self.blocks:
            h = b(h, src_mask=mask, is_causal=True)
        return nn.functional.cross_entropy(self.head(h).flatten(0, 1), y.flatten())


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [tuple(torch.randint(0, VOCAB, (2, 4, SEQ), generator=g)) for _ in range(STEPS)]


def _run(budget: int) -> tuple[list[float], int]:
    """Losses until a CapacityError (re-raised with the step it came in as ``args[1]``)."""
    torch.manual_seed(0)
    cfg = GeminiConfig(precision="fp32", accelerator_bytes=budget, chunk_numel=CHUNK)
    gm = apply_gemini(_StockNet(), cfg)
    opt = GeminiOptimizer(gm, lr=1e-2)
    losses = []
    for i, (x, y) in enumerate(_batches()):
        try:
            loss = gm(x, y)
            opt.backward(loss)
            opt.step()
        except CapacityError as err:
            raise CapacityError(str(err), i) from err
        opt.zero_grad()
        losses.append(loss.item())
    return losses, gm.memory_stats().bytes_moved


def _reference() -> list[float]:
    torch.manual_seed(0)
    model = _StockNet()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    out = []
    for x, y in _batches():
        loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        out.append(loss.item())
    return out


@pytest.mark.parametrize("chunks", [2.5, 3.5, 4.5, 6.5])
def test_a_stock_attention_run_is_refused_in_its_warmup_or_trains_every_step(chunks):
    budget = int(chunks * CHUNK_BYTES)
    try:
        losses, moved = _run(budget)
    except CapacityError as err:
        assert err.args[1] == 0, f"refused in step {err.args[1] + 1}, after the warmup: {err}"
        assert chunks < 6.5, "the largest budget here holds every moment: it must train"
        return
    ref = _reference()
    assert moved > 0  # the budget moved chunks
    assert max(abs(a - b) / b for a, b in zip(losses, ref, strict=True)) <= 1e-5
