"""The static (meta-device) estimate against the exact live-tensor measurement."""

import sys
from pathlib import Path

import pytest
import torch

from colossal_contracts import ConfigError, TierName
from colossal_memtrace import estimate_step, trace_step

sys.path.insert(0, str(Path(__file__).parent))
from _models_memtrace import TinyLM

CASES = [  # (vocab, hidden, heads, layers, batch, seq)
    (64, 32, 2, 1, 2, 16),
    (128, 64, 4, 2, 3, 32),
    (96, 48, 4, 3, 2, 64),
]


@pytest.mark.parametrize(("vocab", "hidden", "heads", "layers", "batch", "seq"), CASES)
def test_estimate_matches_live_peak(vocab, hidden, heads, layers, batch, seq):
    def build():
        return TinyLM(vocab, hidden, heads, layers)

    def inputs(device):
        idx = torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(0))
        return idx.to(device), idx.roll(1, 1).to(device)

    torch.manual_seed(0)
    model = build()
    measured = trace_step(
        model, inputs(torch.device("cpu")), optimizer=torch.optim.Adam(model.parameters())
    )
    est = estimate_step(build, inputs, build_optimizer=torch.optim.Adam)
    assert est.source == "static-estimate" and est.device == "meta"
    assert [m.label for m in est.moments] == [m.label for m in measured.moments]
    assert est.compute_order() == measured.compute_order()
    ratio = est.peak_bytes() / measured.peak_bytes()
    assert abs(ratio - 1) < 0.10, ratio
    # Per moment too: every non-model peak within 10% (or a few bytes) of the measured one.
    for i in range(est.num_moments()):
        a, b = (
            est.non_model_peak(i, TierName.ACCELERATOR),
            measured.non_model_peak(i, "accelerator"),
        )
        assert abs(a - b) <= max(0.10 * b, 64), (est.moments[i].label, a, b)


def test_attention_kernel_matters_and_target_picks_it():
    """On meta, plain SDPA would materialise (B, H, T, T) scores; the CPU target avoids that."""

    def build():
        return TinyLM(64, 32, 4, 1)

    def inputs(device):
        idx = torch.zeros(2, 256, dtype=torch.long, device=device)
        return idx, idx

    model = build()
    measured = trace_step(model, inputs(torch.device("cpu")))
    est = estimate_step(build, inputs)
    assert abs(est.peak_bytes() / measured.peak_bytes() - 1) < 0.02
    with pytest.raises(ConfigError, match="target"):
        estimate_step(build, inputs, target="tpu")


def test_estimate_of_a_checkpointed_model():
    """Blocks under torch.utils.checkpoint are recomputed in backward, where the attention mimic
    must be active too (else the recompute's shapes differ and checkpoint raises): the estimate
    matches the measured step, its recompute moments are backward ones, and it keeps fewer
    activations than the same model without checkpointing."""

    def inputs(device):
        idx = torch.randint(0, 64, (2, 64), generator=torch.Generator().manual_seed(0))
        return idx.to(device), idx.roll(1, 1).to(device)

    est, measured = {}, {}
    for ckpt in (False, True):

        def build(ckpt=ckpt):
            return TinyLM(64, 32, 4, 2, checkpointed=ckpt)

        torch.manual_seed(0)
        model = build()
        opt = torch.optim.Adam(model.parameters())
        measured[ckpt] = trace_step(model, inputs(torch.device("cpu")), optimizer=opt)
        est[ckpt] = estimate_step(build, inputs, build_optimizer=torch.optim.Adam)
    ck, m = est[True], measured[True]
    assert [x.label for x in ck.moments] == [x.label for x in m.moments]
    assert abs(ck.peak_bytes() / m.peak_bytes() - 1) < 0.02
    again = [x for x in ck.moments if x.label.startswith("recompute:")]
    assert {x.label for x in again} == {
        x.label.replace("bwd:", "recompute:")
        for x in ck.moments
        if x.label.startswith("bwd:blocks.")
    }
    assert all(x.phase == "backward" for x in again)
    acc = "accelerator"
    assert ck.peak_non_model(acc) < 0.7 * est[False].peak_non_model(acc)
    assert ck.model_bytes(ck.num_moments() - 1, acc) == est[False].model_bytes(
        est[False].num_moments() - 1, acc
    )


def test_estimate_allocates_nothing_for_a_large_model():
    def build():
        return TinyLM(vocab=50_000, hidden=2048, heads=16, num_layers=4)  # ~1.2 GB of fp32 params

    def inputs(device):
        idx = torch.zeros(8, 512, dtype=torch.long, device=device)
        return idx, idx

    est = estimate_step(build, inputs, build_optimizer=torch.optim.Adam)
    params = 50_000 * 2048 + 4 * (12 * 2048 * 2048 + 13 * 2048) + 2 * 2048
    assert est.model_bytes(est.num_moments() - 1, "accelerator") >= 3 * 4 * params
    assert est.peak_bytes() > 4 * 4 * params  # params + grads + two Adam states + activations
