"""The pre-check of ``colossal train --model hf:`` at sizes where it traces the step's
activations on the meta device: Hugging Face GPT-2's forward reads a value (its packed-sequence
mask calls ``.all()``), which a meta tensor cannot give; the check then falls back to the model
states alone instead of failing with "Tensor.item() cannot be called on meta tensors"."""

from __future__ import annotations

import json

import pytest

from colossal.train._models import resolve_model
from colossal.train._preflight import check_fits
from colossal_contracts import ConfigError


def _spec(tmp_path):
    cfg = {"model_type": "gpt2", "n_layer": 1, "n_embd": 64, "n_head": 1, "n_positions": 16,
           "vocab_size": 256, "bos_token_id": 0, "eos_token_id": 0}  # fmt: skip
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return resolve_model(f"hf:{path}", "", vocab_size=256)


def test_hf_gpt2_precheck_checks_states_when_the_trace_cannot_run(tmp_path):
    spec = _spec(tmp_path)
    kw = dict(build=spec.build, num_params=spec.num_params, label=spec.label, presets={},
              batch_size=1, seq_len=16, sharded=True, world=1)  # fmt: skip
    # states above a quarter of what is free: the activation trace runs (and cannot, on meta)
    assert check_fits(**kw, states=10**9, available=2 * 10**9) == 10**9
    with pytest.raises(ConfigError, match="needs about"):
        check_fits(**kw, states=3 * 10**9, available=2 * 10**9)
