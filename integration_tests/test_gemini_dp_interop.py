"""Modules that read parameters outside their own forward train under Gemini on several
data-parallel ranks with plain AdamW's losses (fp32): stock ``nn.MultiheadAttention`` (its
``out_proj.weight`` is read by the attention function, and with ``need_weights=False`` it returns
``(tensor, None)``) and an unmodified Hugging Face GPT-2 (tied head, Conv1D) built from a small
config."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
from _weights import assert_weights_close
from torch import nn

from colossal_zero import GeminiConfig, GeminiOptimizer, apply_gemini

VOCAB, SEQ, BATCH, STEPS, LR = 64, 8, 8, 4, 1e-2
# Budgets that hold part of the model: chunks move (and are gathered/released) every step.
CONFIGS = {
    "mha": GeminiConfig(precision="fp32", accelerator_bytes=120_000, chunk_numel=4096),
    "gpt2": GeminiConfig(precision="fp32", accelerator_bytes=160_000, chunk_numel=4096),
}


class MhaNet(nn.Module):
    """Two stock attention layers: one returns (out, weights), one (out, None)."""

    def __init__(self, dim: int = 32) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, dim)
        self.attn = nn.ModuleList(nn.MultiheadAttention(dim, 4, batch_first=True) for _ in "ab")
        self.head = nn.Linear(dim, VOCAB)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = self.emb(x)
        for i, a in enumerate(self.attn):
            h = h + a(h, h, h, need_weights=i == 0)[0]
        return nn.functional.cross_entropy(self.head(h).flatten(0, 1), y.flatten())


def _mha() -> nn.Module:
    torch.manual_seed(0)
    return MhaNet()


def _gpt2() -> nn.Module:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=4, vocab_size=VOCAB, n_positions=SEQ, bos_token_id=0,
        eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(cfg)


BUILDERS = {"mha": _mha, "gpt2": _gpt2}


def _loss(model: nn.Module, kind: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    if kind == "gpt2":
        return model(input_ids=x, labels=x).loss
    return model(x, y)


KEY_BIAS = ("in_proj_bias", "c_attn.bias")  # fused (query, key, value) biases


def _data() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(5)
    return [tuple(torch.randint(0, VOCAB, (2, BATCH, SEQ), generator=g)) for _ in range(STEPS)]  # type: ignore[misc]


def _reference(kind: str) -> tuple[list[float], dict[str, torch.Tensor]]:
    model = BUILDERS[kind]()
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    losses = []
    for x, y in _data():
        loss = _loss(model, kind, x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, copy.deepcopy(model.state_dict())


def gemini_rank(kind: str) -> tuple[list[float], dict[str, torch.Tensor], int]:
    """Runs on every rank: this rank's rows of each batch; the global mean loss per step (GPT-2's
    loss is a mean over equal-length rows, so the mean of the ranks' means is the global one)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    per = BATCH // world
    plain = BUILDERS[kind]()
    gm = apply_gemini(plain, CONFIGS[kind])
    opt = GeminiOptimizer.from_torch(gm, torch.optim.AdamW(plain.parameters(), lr=LR))
    losses = []
    for x, y in _data():
        loss = _loss(gm, kind, x[rank * per : (rank + 1) * per], y[rank * per : (rank + 1) * per])
        opt.backward(loss)
        opt.step()
        opt.zero_grad()
        t = torch.tensor([loss.item()])
        dist.all_reduce(t)
        losses.append(float(t) / world)
    return losses, gm.full_state_dict(), gm.memory_stats().bytes_moved


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("kind", ["mha", "gpt2"])
def test_modules_reading_params_outside_forward_train_on_several_ranks(world, kind, n):
    if kind == "gpt2":
        pytest.importorskip("transformers")
    ref_losses, ref_weights = _reference(kind)
    for losses, weights, moved in world(n).run(gemini_rank, kind):
        assert moved > 0
        assert losses == pytest.approx(ref_losses, rel=1e-5)
        # the key third: each Adam step moves an element by at most about lr
        assert_weights_close(
            weights,
            ref_weights,
            rel=1e-5,
            key_atol=STEPS * LR,
            key_bias=KEY_BIAS,
            label=f"{kind} on {n} ranks: ",
        )
