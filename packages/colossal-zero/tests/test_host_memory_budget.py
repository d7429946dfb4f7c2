"""colossal-chunk's [Note: bounded host heap] as Gemini wires it: ``apply_gemini`` fixes the C
library's mmap threshold only where a host budget was asked for, and under one every optimizer
step trims the heap before it updates anything. The two calls are recorded here, not made (they
change the whole process); colossal-chunk's test_host_heap checks what they do."""

from __future__ import annotations

import _checks_zero as checks
import pytest

import colossal_zero.gemini._module as gemini_module
import colossal_zero.gemini._optimizer as gemini_optimizer
from colossal_zero import GeminiConfig

STEPS, BATCH = 3, 4


@pytest.mark.parametrize("host_bytes", [None, 1 << 30])
def test_a_host_budget_maps_large_blocks_and_trims_before_each_update(monkeypatch, host_bytes):
    mapped: list[bool] = []
    trims: list[set[float]] = []  # per trim, the step counts the optimizer held then
    monkeypatch.setattr(gemini_module, "map_large_host_blocks", lambda: mapped.append(True))
    opt = None

    def trim() -> None:
        trims.append({float(s) for s in opt.steps.values()})  # type: ignore[union-attr]

    monkeypatch.setattr(gemini_optimizer, "trim_host_heap", trim)
    model, opt = checks.make(
        GeminiConfig(precision="fp32", chunk_numel=8192, host_bytes=host_bytes)
    )
    losses = checks.train(model, opt, STEPS, BATCH)
    assert len(losses) == STEPS
    if host_bytes is None:  # no budget: the C library's settings are left alone
        assert mapped == [] and trims == []
        return
    assert mapped == [True]  # once, when the model was wrapped
    # one trim per step, before its update: step k trims while the counts still say k - 1
    assert trims == [set()] + [{float(k)} for k in range(1, STEPS)]
    assert {float(s) for s in opt.steps.values()} == {float(STEPS)}
