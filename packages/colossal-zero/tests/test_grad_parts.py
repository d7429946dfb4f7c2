"""A parameter whose gradient arrives in parts ([Note: gradients in parts] in ``gemini/_collect.py``).

On CUDA, a chunk evicted to the host between two readers of a parameter in one forward moves the
parameter's ``.data`` to another device, which drops its gradient accumulator (torch's
``set_data``): the tied embedding of ``_Net`` then got two accumulators, its gradient hook ran
twice per backward, and the first part pinned the gradient chunk until a later access was
refused (found on an H200: ``test_fp64_precision``'s Gemini case under a 40,000-byte budget). On
the CPU both tiers are one device, so here a dtype hop of the tied weight's ``.data`` between its
two readers drops the accumulator as the device change does there."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_fp64_precision import CLIP, LR, TOL, _data, _groups, _Net, _reference, _train, _worst

from colossal_zero import GeminiConfig, GeminiOptimizer, apply_gemini
from colossal_zero.gemini._runtime import GeminiRuntime


def _drop_accumulator_between_readers(model: _Net) -> None:
    """Emulate CUDA's device hop: before ``model.ln`` runs (after the embedding read the tied
    weight, before the head reads it again) set the weight's ``.data`` to another type and back,
    which drops its gradient accumulator: each reader's gradient then arrives on its own."""
    weight = model.emb.weight

    def hop(*_: object) -> None:
        data = weight.data
        weight.data = torch.empty(0, dtype=torch.float16)
        weight.data = data

    model.ln.register_forward_pre_hook(hop)


def _gemini(model: torch.nn.Module) -> tuple[torch.nn.Module, GeminiOptimizer]:
    groups = _groups(model)
    cfg = GeminiConfig(precision="fp64", device="cpu", chunk_numel=2048, accelerator_bytes=40_000)
    gm = apply_gemini(model, cfg)
    return gm, GeminiOptimizer(gm, groups, lr=LR, max_grad_norm=CLIP)


def test_a_gradient_in_parts_is_collected_once_as_its_sum():
    torch.manual_seed(0)
    model = _Net()
    ref_losses, ref = _reference(model)
    gm, opt = _gemini(model)
    _drop_accumulator_between_readers(model)
    calls = []  # per backward: how often the tied weight's accumulators ran
    model.emb.weight.register_post_accumulate_grad_hook(lambda p: calls.append(gm.runtime.forwards))
    losses = _train(gm, opt)  # refused at the 2nd step's backward when parts were collected
    assert max(calls.count(f) for f in set(calls)) == 2  # the emulation did split the gradient
    assert max(abs(a - b) / b for a, b in zip(losses, ref_losses, strict=True)) <= TOL
    assert _worst(gm.full_state_dict(), ref) <= TOL
    assert not gm.runtime._parts and model.emb.weight.grad is None


class _SideHead(_Net):
    """``_Net`` with one more read of the tied weight, whose output is ``kept`` on the module
    (its backward never runs, its graph lives) or dropped (its graph goes at once)."""

    def __init__(self, kept: bool) -> None:
        super().__init__()
        self.kept = kept

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = self.emb(x)
        side = F.linear(h, self.emb.weight)
        self.side = side if self.kept else None
        h = h + self.fc2(F.gelu(self.fc1(self.ln(h))))
        return F.cross_entropy(F.linear(h, self.emb.weight).flatten(0, 1), y.flatten())


@pytest.mark.parametrize("kept", [True, False])
def test_a_reader_whose_backward_never_runs(monkeypatch, kept):
    """Kept: the tied weight's gradient waits for that reader and is collected at the end of
    backward. Dropped: its graph went in forward, so it is not waited for."""
    left = []
    collect_parts = GeminiRuntime._collect_parts

    def spy(self):
        left.append(set(self._parts))
        collect_parts(self)

    monkeypatch.setattr(GeminiRuntime, "_collect_parts", spy)
    torch.manual_seed(0)
    model = _SideHead(kept)
    ref_losses, ref = _reference(model)
    gm, opt = _gemini(model)
    losses = _train(gm, opt)
    assert left == [{"emb.weight"} if kept else set()] * len(_data())
    assert max(abs(a - b) / b for a, b in zip(losses, ref_losses, strict=True)) <= TOL
    assert _worst(gm.full_state_dict(), ref) <= TOL
