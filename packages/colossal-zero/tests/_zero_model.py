"""A small GPT-like transformer for colossal-zero's tests (tied head, pre-LayerNorm blocks)."""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, DIM, LAYERS, SEQ = 64, 32, 3, 16


class Block(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d)  # k-bias: zero grad
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, 2, c // 2).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, D)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TinyGPT(nn.Module):
    def __init__(self, layers: int = LAYERS, dim: int = DIM, unused: bool = False):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, dim), nn.Embedding(SEQ, dim)
        self.blocks = nn.ModuleList(Block(dim) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        self.spare = nn.Linear(dim, dim) if unused else None  # never used in forward

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for blk in self.blocks:
            x = blk(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # tied head
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def build(seed: int = 0, **kw: object) -> TinyGPT:
    torch.manual_seed(seed)
    return TinyGPT(**kw)  # type: ignore[arg-type]


def batches(steps: int, batch: int, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randint(0, VOCAB, (batch, SEQ), generator=g),
         torch.randint(0, VOCAB, (batch, SEQ), generator=g))
        for _ in range(steps)
    ]  # fmt: skip


def param_groups(model: nn.Module, wd: float = 0.1) -> list[dict]:
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    other = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    return [{"params": decay, "weight_decay": wd}, {"params": other, "weight_decay": 0.0}]


def reference(
    steps: int,
    batch: int,
    *,
    accum: int = 1,
    clip: float = 0.0,
    autocast: bool = False,
    lr: float = 1e-2,
    freeze: tuple[str, ...] = (),
    **kw: object,
) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Plain PyTorch AdamW on one process: losses per step and final weights. Parameters whose
    names start with one of ``freeze`` get ``requires_grad=False``."""
    model = build(**kw)
    for n, p in model.named_parameters():
        if n.startswith(freeze):
            p.requires_grad_(False)
    opt = torch.optim.AdamW(param_groups(model), lr=lr)
    losses = []
    for x, y in batches(steps * accum, batch):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = model(x, y) / accum
        loss.backward()
        losses.append(loss.item() * accum)
        if len(losses) % accum == 0:
            if clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            opt.step()
            opt.zero_grad()
    return losses, copy.deepcopy(model.state_dict())


def adamw_losses(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int, *, lr: float, clip: float = 0.0
) -> list[float]:
    """Plain PyTorch AdamW (default settings but ``lr``) on ``model``, ``steps`` steps on the same
    batch, gradients clipped to ``clip`` when it is set: the loss of every step."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        loss = model(x, y)
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


# [Note: bf16 tolerance] A bf16 run is judged by how far each tensor ends from where plain fp32
# AdamW takes it, as a fraction of how far fp32 training moved that tensor: at most
# ``BF16_DRIFT`` = 1/4. AdamW divides each gradient element by its own running magnitude, so
# rounding that flips a small gradient's sign moves an element by up to the learning rate per
# step; on a tensor of small norm (a LayerNorm bias near 0.25) that is several percent of its norm
# within ten steps. Measured after 6-10 steps on an AVX512-BF16 CPU: our bf16 runs 7.8% at most
# (a LayerNorm bias), torch.autocast's own bf16 run 6.0%. Against the tensor's norm instead, or
# against the autocast run (whose drift adds to ours), the same runs measured 8%, over a 5% bound.
# A tensor bf16 failed to train is off by 100%, one whose updates are scaled wrongly by the error
# in the scale.
BF16_DRIFT = 0.25
_MODEL_ARGS = ("seed", "layers", "dim", "unused")  # build's, the rest are reference's


def assert_like_fp32(weights: dict[str, torch.Tensor], steps: int, batch: int, **kw) -> None:
    """Every tensor of ``weights`` (a low-precision run of ``reference``'s recipe with ``kw``) ends
    within ``BF16_DRIFT`` of fp32 training's displacement of it from its initial value (see
    [Note: bf16 tolerance])."""
    start = build(**{k: v for k, v in kw.items() if k in _MODEL_ARGS}).state_dict()
    _, fp32 = reference(steps, batch, **kw)
    drift = {}
    for k, want in fp32.items():
        moved = float((want - start[k]).norm())
        off = float((weights[k].float() - want).norm())
        drift[k] = off / moved if moved else (0.0 if off == 0 else math.inf)  # frozen: unchanged
    over = {k: d for k, d in drift.items() if d > BF16_DRIFT}
    assert not over, f"off fp32 training by more than {BF16_DRIFT} of its displacement: {over}"
