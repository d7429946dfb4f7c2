"""The planner's Gemini term against the runtime in one process ([Note: gemini chunks]): the
chunk size and count it plans are the ones ``apply_gemini`` lays out (with no budget and under
the tiers' budget), and its predicted per-rank peak is the live-tensor peak of a training step
after the first (see [Note: measured peak] in ``_checks_plan_peak``), within 5%. The four-rank
terms (gathered chunks) are checked by ``benchmarks/run.py plan_vs_measured``."""

from __future__ import annotations

import pytest
import torch
from _gemini_peaks import step_peaks

from colossal.plan import Layout, device_memory, from_gpt_config
from colossal.plan._gemini import gemini_bytes, param_numels, tier_budget
from colossal_memtrace import LiveTensorTracker
from colossal_models import GPT, GPTConfig
from colossal_zero import GeminiConfig, GeminiOptimizer, apply_gemini

CFG = GPTConfig(vocab_size=256, max_seq_len=128, num_layers=2, num_heads=4, hidden_size=64)
BATCH = 2


def _layout(method: str) -> Layout:
    return Layout(1, 1, 1, "1d", 1, method, BATCH, 1, "none")


def _gemini_config(method: str, precision: str) -> GeminiConfig:
    """What ``colossal train --layout`` gives the runtime for ``method`` (one rank)."""
    if method == "gemini":
        return GeminiConfig(precision=precision)
    mem = device_memory(
        from_gpt_config(CFG, "t"), _layout(method), CFG.max_seq_len, precision=precision
    )
    return GeminiConfig(
        precision=precision,
        accelerator_bytes=tier_budget(mem.device_total),
        non_model_bytes=int(mem.activations),
    )


def _run(method: str, precision: str) -> tuple[int, int, int]:
    """Chunk size, parameter chunks and the peak live bytes of a step after the first."""
    tracker = LiveTensorTracker("cpu")
    with tracker:
        torch.manual_seed(0)
        model = apply_gemini(GPT(CFG), _gemini_config(method, precision))
        opt = GeminiOptimizer(model, lr=1e-3)
        x, y = torch.randint(0, CFG.vocab_size, (2, BATCH, CFG.max_seq_len))
        peaks = step_peaks(tracker, model, opt, x, y)
        manager = model.runtime.manager
        chunks = len(manager.registry.param_chunks())
        return manager.registry.chunk_numel, chunks, min(peaks[1:])


def test_param_numels_are_gpts():
    shape = from_gpt_config(CFG, "t")
    assert param_numels(shape, _layout("gemini")) == tuple(p.numel() for p in GPT(CFG).parameters())


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("method", ["gemini", "gemini-host"])
def test_planned_chunks_and_peak_match_runtime(method, precision):
    shape = from_gpt_config(CFG, "t")
    lay = _layout(method)
    mem = device_memory(shape, lay, CFG.max_seq_len, precision=precision)
    planned = gemini_bytes(shape, lay, precision, mem.activations)
    numel, chunks, peak = _run(method, precision)
    assert (planned.chunk_numel, planned.num_chunks) == (numel, chunks)
    # the emulated accelerator and the host are the same memory: the tracker sees both
    assert mem.device_total + mem.host == pytest.approx(peak, rel=0.05), (mem, peak)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_planned_frozen_chunk_size_is_the_runtimes(precision):
    # LoRA: the frozen base and the adapters are searched apart ([Note: chunk size per kind])
    from dataclasses import replace

    from colossal.lora._apply import LoraSpec, apply_lora

    torch.manual_seed(0)
    model, _ = apply_lora(GPT(CFG), LoraSpec(rank=4), label="t")
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    base = from_gpt_config(CFG, "t")
    shape = replace(base, params=base.params + trainable, frozen=base.params)
    lay = _layout("gemini")
    mem = device_memory(shape, lay, CFG.max_seq_len, precision=precision)
    planned = gemini_bytes(shape, lay, precision, mem.activations)
    manager = apply_gemini(model, GeminiConfig(precision=precision)).runtime.manager
    frozen = [c for c in manager.registry.param_chunks() if c.frozen]
    assert planned.frozen_chunk_numel == manager.config.frozen_chunk_numel
    assert planned.frozen_chunks == len(frozen) > 0


def test_disk_tier_fills_the_given_host_memory_not_more():
    # a run given --host-budget H keeps on the host what H holds and spills the rest of the
    # optimizer states to disk: the plan fits whenever the bytes that must live on the host do
    cfg = GPTConfig(vocab_size=256, max_seq_len=64, num_layers=4, num_heads=8, hidden_size=512)
    shape, lay, seq = from_gpt_config(cfg, "t"), _layout("gemini-disk"), cfg.max_seq_len
    free = device_memory(shape, lay, seq)  # the job's own host budget: twice the need
    gem = gemini_bytes(shape, lay, "bf16", max(free.activations, free.overlap))
    need = gem.params + gem.grads  # the 16-bit parameters (bf16: no gradient chunk)
    assert free.host_budget == tier_budget(need) and free.disk > 0
    everything = free.buffers + free.host + free.disk - free.read_ahead - gem.spare - gem.gathered
    assert everything == gem.params + gem.grads + gem.optimizer  # no byte lost or counted twice
    tight = device_memory(shape, lay, seq, host_memory=need * 1.25)
    assert tight.host_budget == int(need * 1.25) and tight.disk >= free.disk  # whole shards
    assert tight.host + tight.disk - tight.read_ahead == pytest.approx(
        free.host + free.disk - free.read_ahead
    )
    short = device_memory(shape, lay, seq, host_memory=need / 2)
    assert short.host_budget == need  # what must live there: the search then refuses the layout
