"""Gemini sharded checkpoints without frozen values ([Note: omitted frozen values]): the frozen
parameters are neither written nor listed, the index names them; a load keeps the model's own
frozen values (never writing their chunks) and continues training exactly; a model in which an
omitted parameter trains is refused in one line."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from test_gemini_frozen import CASES, FROZEN, _batches, _gemini, _model, _train

from colossal_contracts import CheckpointError
from colossal_zero import consolidate, load_sharded, save_sharded
from colossal_zero.checkpoint import INDEX_FILE


def test_checkpoint_without_frozen_values_resumes_exactly(tmp_path):
    cfg = CASES["accelerator and host"]
    batches = _batches()
    gm, opt = _gemini(cfg)
    _train(gm, opt, batches[:2])
    save_sharded(gm, opt, tmp_path, frozen_values=False)
    want = _train(gm, opt, batches[2:])

    frozen = sorted(n for n, p in _model().named_parameters() if not p.requires_grad)
    index = json.loads((tmp_path / INDEX_FILE).read_text())
    assert index["frozen_omitted"] == frozen and not set(frozen) & set(index["params"])
    (shard,) = tmp_path.glob("gemini-rank*.safetensors")
    with safe_open(str(shard), framework="pt") as f:
        saved = list(f.keys())
    assert saved and not [k for k in saved if k.split("/", 1)[1].startswith(FROZEN)]
    assert not set(frozen) & set(consolidate(tmp_path))

    other = _model()  # the same frozen values (its source), trainable ones changed
    with torch.no_grad():
        for p in other.parameters():
            if p.requires_grad:
                p.add_(1.0)
    gm2, opt2 = _gemini(cfg, other)
    load_sharded(gm2, opt2, tmp_path)
    assert gm2.memory_stats().frozen_written_bytes == 0  # frozen chunks kept, not loaded
    assert _train(gm2, opt2, batches[2:]) == want
    a, b = gm.full_state_dict(), gm2.full_state_dict()
    assert all(torch.equal(a[n], b[n]) for n in a)


def test_omitted_value_of_a_trained_parameter_refused(tmp_path):
    cfg = CASES["accelerator and host"]
    gm, opt = _gemini(cfg)
    save_sharded(gm, opt, tmp_path, frozen_values=False)
    gm2, opt2 = _gemini(cfg, _model(freeze=False))
    with pytest.raises(CheckpointError, match="without values as frozen") as err:
        load_sharded(gm2, opt2, tmp_path)
    assert "\n" not in str(err.value)
