"""memtrace's static estimate on the real GPT with activation-checkpointed blocks
(``apply_activation_checkpointing``): the recompute in backward is estimated like the forward it
repeats ([Note: attention mimic in recompute] in colossal-memtrace)."""

import torch

from colossal_contracts import TierName
from colossal_memtrace import estimate_step, trace_step
from colossal_models import GPT, GPTConfig, apply_activation_checkpointing

CFG = GPTConfig(vocab_size=256, max_seq_len=128, num_layers=3, num_heads=2, hidden_size=32)
ACC = TierName.ACCELERATOR


def _build(checkpointed: bool):  # type: ignore[no-untyped-def]
    def build() -> GPT:
        model = GPT(CFG)
        apply_activation_checkpointing(model, enabled=checkpointed)
        return model

    return build


def _inputs(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    idx = torch.randint(0, CFG.vocab_size, (2, 128), generator=torch.Generator().manual_seed(0))
    return idx.to(device), idx.roll(-1, 1).to(device)


def test_estimate_of_checkpointed_gpt_matches_its_measured_step():
    torch.manual_seed(0)
    model = _build(True)()
    opt = torch.optim.AdamW(model.parameters())
    measured = trace_step(model, _inputs(torch.device("cpu")), optimizer=opt)
    est = estimate_step(_build(True), _inputs, build_optimizer=torch.optim.AdamW)
    plain = estimate_step(_build(False), _inputs, build_optimizer=torch.optim.AdamW)
    assert [m.label for m in est.moments] == [m.label for m in measured.moments]
    assert any(m.label.startswith("recompute:") for m in est.moments)
    assert abs(est.peak_bytes() / measured.peak_bytes() - 1) <= 0.02
    assert abs(est.peak_non_model(ACC) / measured.peak_non_model(ACC) - 1) <= 0.02
    # checkpointing keeps each block's input only: fewer activation bytes than without it
    assert est.peak_non_model(ACC) < 0.8 * plain.peak_non_model(ACC)
