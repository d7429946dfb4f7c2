"""Issue 35 item 3: ``colossal train`` builds its model lazily ([Note: lazy job]) under Gemini,
ZeRO and the hybrid plugin, and the run is the eager build's bit for bit: the weights right
after setup and the losses of two steps."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch

from colossal.booster import Booster, GeminiPlugin, HybridParallelPlugin, LowLevelZeroPlugin
from colossal.train import TrainConfig, train

models = importlib.import_module("colossal.train._models")  # colossal.train is also a function

RUNS = {  # name -> TrainConfig settings beyond the common ones
    "gemini": {"plugin": "gemini", "host_budget": "64MiB"},
    "zero2": {"plugin": "zero", "zero": 2},
    "hybrid": {"plugin": "hybrid", "zero": 1},
}


def _setup_weights(model, optimizer, plugin) -> dict[str, torch.Tensor]:  # type: ignore[no-untyped-def]
    if isinstance(plugin, GeminiPlugin):
        return model.full_state_dict()
    if isinstance(plugin, LowLevelZeroPlugin):
        return optimizer.full_state_dict()
    assert isinstance(plugin, HybridParallelPlugin)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _run(tmp_path: Path, name: str, monkeypatch, *, lazy: bool) -> tuple[dict, list[float]]:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(models, "LAZY_PLUGINS", models.LAZY_PLUGINS if lazy else ())
    seen: dict[str, object] = {}
    boost = Booster.boost

    def spy(self, model, optimizer):  # type: ignore[no-untyped-def]
        seen["meta"] = any(p.is_meta for p in model.parameters())
        model, optimizer = boost(self, model, optimizer)
        seen["weights"] = _setup_weights(model, optimizer, self.plugin)
        return model, optimizer

    monkeypatch.setattr(Booster, "boost", spy)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog. " * 200)
    cfg = TrainConfig(
        preset="nano",
        steps=2,
        batch_size=2,
        seq_len=16,
        corpus=corpus,
        out=tmp_path / f"{name}-{lazy}",
        checkpoint_every=0,
        export="none",
        **RUNS[name],
    )
    result = train(cfg)
    assert seen["meta"] == lazy  # the model reached the plugin on the meta device, or not
    return seen["weights"], result.losses  # type: ignore[return-value]


@pytest.mark.parametrize("name", list(RUNS))
def test_the_job_builds_lazily_and_equals_the_eager_build(tmp_path, monkeypatch, name):
    lazy_w, lazy_losses = _run(tmp_path, name, monkeypatch, lazy=True)
    eager_w, eager_losses = _run(tmp_path, name, monkeypatch, lazy=False)
    assert lazy_w.keys() == eager_w.keys()
    for k in eager_w:
        assert torch.equal(lazy_w[k], eager_w[k]), k
    assert len(lazy_losses) == 2 and lazy_losses == eager_losses
