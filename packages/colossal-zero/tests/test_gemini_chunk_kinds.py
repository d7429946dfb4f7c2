"""A chunk size per chunk kind under Gemini (colossal-chunk's [Note: chunk size per kind]): the
frozen (``requires_grad=False``) parameters' chunks and the trainable ones' are each sized by a
search over their own tensors, or as configured; every chunk keeps its kind's size through the
warmup's fit and re-pack; training still equals plain PyTorch AdamW; a model with no frozen
parameter keeps one size."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from colossal_contracts import ConfigError
from colossal_zero import GeminiConfig, GeminiOptimizer, apply_gemini

D, H, R, V, STEPS = 32, 128, 2, 64, 3


class SidePath(nn.Module):
    """Frozen wide layers (D x H matrices) with small trainable low-rank side paths."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.up = nn.ModuleList(nn.Linear(D, H) for _ in range(3))
        self.down = nn.ModuleList(nn.Linear(H, D) for _ in range(3))
        self.a = nn.ModuleList(nn.Linear(D, R, bias=False) for _ in range(3))
        self.b = nn.ModuleList(nn.Linear(R, D, bias=False) for _ in range(3))
        self.head = nn.Linear(D, V)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = self.emb(x)
        for up, down, a, b in zip(self.up, self.down, self.a, self.b, strict=True):
            h = h + down(torch.tanh(up(h))) + b(a(h))
        return F.cross_entropy(self.head(h).flatten(0, 1), y.flatten())


def _model(*, freeze: bool = True) -> SidePath:
    torch.manual_seed(0)
    m = SidePath()
    for n, p in m.named_parameters():
        p.requires_grad_(not freeze or n.startswith(("a.", "b.")))
    return m


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [tuple(torch.randint(0, V, (2, 2, 8), generator=g)) for _ in range(STEPS)]  # type: ignore[misc]


def _train(model: nn.Module, cfg: GeminiConfig | None):  # type: ignore[no-untyped-def]
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=1e-2)
    run = model
    if cfg is not None:
        run = apply_gemini(model, cfg, group=None)
        opt = GeminiOptimizer.from_torch(run, opt)
    losses = []
    for x, y in _batches():
        loss = run(x, y)
        if cfg is None:
            loss.backward()
        else:
            opt.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return run, losses


def _largest(model: nn.Module, frozen: bool) -> int:
    return max(p.numel() for p in model.parameters() if p.requires_grad != frozen)


def _check_kinds(manager) -> None:  # type: ignore[no-untyped-def]
    for c in manager.chunks.values():
        if c.kind == "param":
            want = manager.registry.frozen_chunk_numel if c.frozen else manager.registry.chunk_numel
            assert c.capacity == want
    for cid, group in manager.groups.items():
        for kind, twin in group.twins.items():
            assert twin.capacity == manager.chunks[cid].capacity, kind


BUDGETS = {  # fp32 parameters are 4 * 29_600 bytes: the budgets make chunks move every step
    "no budget": {},
    "accelerator and host": {"accelerator_bytes": 60_000},
}


@pytest.mark.parametrize("budget", list(BUDGETS))
def test_each_kind_is_sized_for_its_own_tensors_and_trains_like_adamw(budget):
    _, want = _train(_model(), None)
    cfg = GeminiConfig(precision="fp32", device="cpu", **BUDGETS[budget])
    gm, losses = _train(_model(), cfg)
    assert max(abs(a - b) for a, b in zip(losses, want, strict=True)) <= 1e-6
    m = gm.runtime.manager
    plain = _model()
    # trainable chunks below the largest frozen matrix: one size would be at least that
    assert _largest(plain, True) <= m.registry.frozen_chunk_numel
    assert _largest(plain, False) <= m.registry.chunk_numel < _largest(plain, True)
    _check_kinds(m)
    assert gm.memory_stats().frozen_written_bytes == 0
    # fewer trainable bytes of padding than with the frozen size for both (the one size before)
    one = GeminiConfig(
        precision="fp32", device="cpu", chunk_numel=m.registry.frozen_chunk_numel, **BUDGETS[budget]
    )
    old, _ = _train(_model(), one)
    pad = {
        k: sum(c.padding for c in g.runtime.manager.registry.trainable_chunks())
        for k, g in (("kinds", gm), ("one", old))
    }
    assert pad["kinds"] < pad["one"]


def test_without_frozen_parameters_one_size_as_before():
    gm, _ = _train(_model(freeze=False), GeminiConfig(precision="fp32", device="cpu"))
    m = gm.runtime.manager
    assert m.config.frozen_chunk_numel is None
    assert m.registry.frozen_chunk_numel == m.registry.chunk_numel
    assert {c.capacity for c in m.chunks.values()} == {m.registry.chunk_numel}


def test_configured_sizes_are_kept():
    both = GeminiConfig(precision="fp32", device="cpu", chunk_numel=8192)
    m = _train(_model(), both)[0].runtime.manager
    assert (m.registry.chunk_numel, m.registry.frozen_chunk_numel) == (
        8192,
        8192,
    )  # one size for both, as given
    apart = GeminiConfig(precision="fp32", device="cpu", chunk_numel=1024, frozen_chunk_numel=8192)
    m = _train(_model(), apart)[0].runtime.manager
    assert (m.registry.chunk_numel, m.registry.frozen_chunk_numel) == (1024, 8192)
    _check_kinds(m)


def test_bad_frozen_chunk_numel_is_refused():
    with pytest.raises(ConfigError, match="frozen_chunk_numel"):
        GeminiConfig(frozen_chunk_numel=0)
    small = GeminiConfig(precision="fp32", device="cpu", frozen_chunk_numel=1024)
    with pytest.raises(ConfigError, match="frozen_chunk_numel=1,024 is smaller than the largest"):
        apply_gemini(_model(), small, group=None)


def test_the_warmup_fit_halves_both_kinds_and_training_stays_exact():
    # frozen chunks of 16384 fp32 elements (64 KiB): a moment and the one before hold two, more
    # than 140,000 bytes less the measured reserve; halved (8192 frozen, 2048 trainable) they fit
    from colossal_memtrace import MomentRecorder

    _, want = _train(_model(), None)
    cfg = GeminiConfig(
        precision="fp32",
        device="cpu",
        accelerator_bytes=140_000,
        chunk_numel=4096,
        frozen_chunk_numel=16384,
        non_model_bytes=20_000,
    )
    model = _model()
    gm = apply_gemini(model, cfg, group=None, recorder=MomentRecorder("cpu"))
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = GeminiOptimizer.from_torch(gm, torch.optim.AdamW(trainable, lr=1e-2))
    losses = []
    for x, y in _batches():
        loss = gm(x, y)
        opt.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    m = gm.runtime.manager
    assert (m.registry.chunk_numel, m.registry.frozen_chunk_numel) == (2048, 8192)
    _check_kinds(m)
    assert max(abs(a - b) for a, b in zip(losses, want, strict=True)) <= 1e-5
