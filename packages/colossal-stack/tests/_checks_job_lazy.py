"""What ``test_job_lazy_build`` runs on each rank: one ``train()`` with the model built lazily
and one built eagerly ([Note: lazy job]), the weights right after setup and the losses."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import torch

from colossal.booster import Booster, GeminiPlugin, HybridParallelPlugin, LowLevelZeroPlugin
from colossal.train import TrainConfig, train

models = importlib.import_module("colossal.train._models")  # colossal.train is also a function


def _setup_weights(model, optimizer, plugin) -> dict[str, torch.Tensor]:  # type: ignore[no-untyped-def]
    """This rank's weights (fp32 masters where they exist), full over dp."""
    if isinstance(plugin, GeminiPlugin):
        return model.full_state_dict()
    if isinstance(plugin, LowLevelZeroPlugin) or (
        isinstance(plugin, HybridParallelPlugin) and plugin.zero_stage
    ):
        return optimizer.full_state_dict()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def run_job(settings: dict[str, Any], root: str, *, lazy: bool) -> dict[str, Any]:
    """``train`` of GPT nano for 2 steps under ``settings``: whether the plugin got a meta
    model, the weights right after ``boost`` and the losses."""
    seen: dict[str, Any] = {}
    boost, kept = Booster.boost, models.LAZY_PLUGINS

    def spy(self, model, optimizer):  # type: ignore[no-untyped-def]
        seen["meta"] = any(p.is_meta for p in model.parameters())
        model, optimizer = boost(self, model, optimizer)
        seen["weights"] = _setup_weights(model, optimizer, self.plugin)
        return model, optimizer

    corpus = Path(root) / "corpus.txt"
    if not corpus.exists():
        corpus.write_text("the quick brown fox jumps over the lazy dog. " * 200)
    cfg = TrainConfig.from_flags(
        preset="nano",
        steps=2,
        batch_size=2,
        seq_len=16,
        corpus=corpus,
        out=Path(root) / f"{'-'.join(map(str, settings.values()))}-{lazy}",
        export="none",
        **settings,
    )
    models.LAZY_PLUGINS = kept if lazy else ()
    Booster.boost = spy  # type: ignore[method-assign]
    try:
        seen["losses"] = train(cfg).losses
    finally:
        Booster.boost, models.LAZY_PLUGINS = boost, kept  # type: ignore[method-assign]
    return seen


def lazy_and_eager(runs: dict[str, dict[str, Any]], root: str) -> dict[str, dict[str, Any]]:
    """``run_job`` of each of ``runs`` built lazily and eagerly: {name: {"lazy": ..., "eager": ...}}."""
    return {
        name: {k: run_job(s, root, lazy=k == "lazy") for k in ("lazy", "eager")}
        for name, s in runs.items()
    }
