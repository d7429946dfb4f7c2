"""The hook tracer: moments, compute order with a tied head, optimizer, sources, warmup/steady."""

import sys
from pathlib import Path

import pytest
import torch

from colossal_contracts import ConfigError, MemStatsSource, TierName
from colossal_memtrace import HookTracer, TraceConfig, trace_step

sys.path.insert(0, str(Path(__file__).parent))
from _models_memtrace import TinyLM, linear_chain

ACC = TierName.ACCELERATOR


def _lm_step(model, opt=None):
    idx = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    return trace_step(model, (idx, idx), optimizer=opt)


def test_tied_head_is_a_parameter_access_moment_and_order_is_complete():
    torch.manual_seed(0)
    model = TinyLM(num_layers=2)
    stats = _lm_step(model)
    assert isinstance(stats, MemStatsSource)
    labels = [m.label for m in stats.moments]
    assert labels[:4] == ["start", "fwd:wte", "fwd:blocks.0.ln1", "fwd:blocks.0.qkv"]
    assert "use:wte.weight" in labels
    head = labels.index("use:wte.weight")
    assert labels[head - 1] == "fwd:ln_f" and labels[head + 1] == "bwd:ln_f"
    assert labels[-1] == "bwd:wte"
    used = {p for ps in stats.compute_order() for p in ps}
    assert used == {n for n, _ in model.named_parameters()}
    # The (B*T, V) logits and their softmax are the head moment's; nothing before it is larger.
    assert stats.non_model_peak(head, ACC) == max(
        stats.non_model_peak(i, ACC) for i in range(head + 1)
    )


def test_without_param_cuts_the_head_folds_into_ln_f():
    model = TinyLM(num_layers=1)
    idx = torch.zeros(2, 8, dtype=torch.long)
    stats = trace_step(model, (idx, idx), config=TraceConfig(cut_on_param_use=False))
    labels = [m.label for m in stats.moments]
    assert not any(lab.startswith("use:") for lab in labels)
    ln_f = stats.moments[labels.index("fwd:ln_f")]
    assert ln_f.params == ("ln_f.weight", "ln_f.bias", "wte.weight")


def test_optimizer_moment_and_model_data_includes_states():
    torch.manual_seed(0)
    model = linear_chain([32, 64, 16])
    opt = torch.optim.Adam(model.parameters())
    x = torch.randn(4, 32)
    stats = trace_step(model, (x,), loss_fn=lambda y: y.sum(), optimizer=opt)
    last = stats.moments[-1]
    assert last.label == "optimizer" and last.phase == "optimizer"
    assert last.params == ("0.weight", "1.weight")
    weights = 4 * (32 * 64 + 64 * 16)
    steps = 2 * 4  # Adam's per-parameter step counters (float32 scalars)
    # grads were set to None after the step: params + exp_avg + exp_avg_sq remain.
    assert stats.model_bytes(len(stats.moments) - 1, ACC) == 3 * weights + steps
    # Adam's new states are model data from their creation: the moment's non-model peak is only
    # the update's temporaries, smaller than the states themselves.
    assert stats.non_model_peak(len(stats.moments) - 1, ACC) < 2 * weights


class _Counter:
    """A model-data source that claims a fixed number of bytes per tier."""

    def __init__(self, acc, host):
        self.by_tier = {TierName.ACCELERATOR: acc, TierName.HOST: host, TierName.DISK: 0}

    def model_data_bytes(self, tier):
        return self.by_tier[tier]


def test_registered_source_replaces_tracked_model_data():
    torch.manual_seed(0)
    model = linear_chain([16, 16])
    x = torch.randn(4, 16)
    tracked = trace_step(model, (x,), loss_fn=lambda y: y.sum())
    model.zero_grad(set_to_none=True)
    src = _Counter(acc=16 * 16 * 4, host=100)  # it says the weight is its data
    tracer = HookTracer(model, sources=[src])
    with tracer.step():
        model(x).sum().backward()
    stats = tracer.stats
    assert stats.model_data == "_Counter"
    assert stats.model_bytes(1, "host") == 100 and stats.model_bytes(1, "disk") == 0
    # With compute on the CPU host bytes are CPU storages too, so both are taken off live bytes.
    for i in range(stats.num_moments()):
        expected = max(0, tracked.total_peak(i, ACC) - 16 * 16 * 4 - 100)
        assert stats.non_model_peak(i, ACC) <= tracked.total_peak(i, ACC)
        assert (
            stats.non_model_peak(i, ACC) >= expected - 16 * 16 * 4
        )  # the grad is not the source's
    with pytest.raises(ConfigError, match="not a ModelDataSource"):
        HookTracer(model, sources=[object()])


def test_warmup_then_steady():
    torch.manual_seed(0)
    model = linear_chain([8, 8, 8])
    x = torch.randn(2, 8)
    tracer = HookTracer(model, config=TraceConfig(warmup_steps=2))
    with pytest.raises(ConfigError, match="no step has been traced"):
        _ = tracer.stats
    seen = []
    for _ in range(4):
        assert tracer.phase == ("warmup" if len(seen) < 2 else "steady")
        with tracer.step():
            seen.append(tracer.tracker is not None)
            model(x).sum().backward()
    assert seen == [True, True, False, False]
    stats = tracer.stats
    assert len(stats.steps) == 2 and stats.extra["warmup_steps"] == 2
    # Step 2 starts with step 1's grads as model data: its first moment holds params + grads.
    assert (
        stats.steps[1].model_bytes_end["accelerator"]
        == stats.steps[0].model_bytes_end["accelerator"]
    )
    assert stats.moments[0].model_bytes["accelerator"] == 2 * 4 * 2 * 64
    assert tracer.stats is stats  # frozen
    with pytest.raises(ConfigError, match="warmup_steps"):
        TraceConfig(warmup_steps=0)


def test_hooks_are_removed_after_tracing():
    model = linear_chain([8, 8])
    before = len(model[0]._forward_pre_hooks), len(model[0]._forward_hooks)
    trace_step(model, (torch.randn(2, 8),), loss_fn=lambda y: y.sum())
    assert (len(model[0]._forward_pre_hooks), len(model[0]._forward_hooks)) == before
