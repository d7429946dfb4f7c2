"""Issue 35 item 3: ``colossal train`` builds its model lazily ([Note: lazy job]) under Gemini
(with and without tp), ZeRO and the hybrid plugin (with pipeline stages), and the run is the eager
build's bit for bit: the weights right after setup and the losses of two steps."""

from __future__ import annotations

import pytest
import torch
from _checks_job_lazy import lazy_and_eager

RUNS_1 = {  # one process
    "gemini": {"plugin": "gemini", "host_budget": "64MiB"},
    "zero2": {"plugin": "zero", "zero": 2},
    "hybrid": {"plugin": "hybrid", "zero": 1},
}
RUNS_2 = {  # two ranks, one shared world
    "gemini-tp2": {"plugin": "gemini", "tp": 2},
    "hybrid-pp2": {"plugin": "hybrid", "pp": 2, "microbatches": 2},
}


def _check(out: dict) -> None:
    lazy, eager = out["lazy"], out["eager"]
    assert lazy["meta"] and not eager["meta"]  # the plugin got a meta model, or a built one
    assert lazy["weights"].keys() == eager["weights"].keys()
    for k, v in eager["weights"].items():
        assert torch.equal(lazy["weights"][k], v), k
    assert len(lazy["losses"]) == 2 and lazy["losses"] == eager["losses"]


@pytest.mark.parametrize("name", list(RUNS_1))
def test_the_job_builds_lazily_and_equals_the_eager_build(tmp_path, name):
    _check(lazy_and_eager({name: RUNS_1[name]}, str(tmp_path))[name])


def test_multi_rank_jobs_build_lazily_and_equal_the_eager_build(world, tmp_path):
    for rank_out in world(2).run(lazy_and_eager, RUNS_2, str(tmp_path)):
        for name in RUNS_2:
            _check(rank_out[name])


def _saved_gpt2(folder, dtype: torch.dtype) -> str:  # type: ignore[no-untyped-def]
    """A tiny GPT-2 with dropout, saved as safetensors in ``dtype`` (save_pretrained)."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=300, n_positions=64)
    torch.manual_seed(7)
    transformers.GPT2LMHeadModel(cfg).to(dtype).save_pretrained(folder)
    return f"hf:{folder}"


@pytest.mark.parametrize("plugin", ["gemini", "zero"])
def test_a_saved_hf_model_is_read_tensor_by_tensor_and_equals_the_eager_load(tmp_path, plugin):
    """[Note: HF weights tensor by tensor]: a saved folder (bf16 on disk, fp32 in the run) is
    built from its config on meta and each tensor read from its file as it is materialized;
    the weights after setup and the losses (dropout on: the generator is left alike) equal
    ``from_pretrained``'s run."""
    settings = {"plugin": plugin, "model": _saved_gpt2(tmp_path / "gpt2", torch.bfloat16)}
    _check(lazy_and_eager({plugin: settings}, str(tmp_path))[plugin])
