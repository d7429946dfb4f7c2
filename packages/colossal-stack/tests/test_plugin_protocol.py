"""Issue 30: a plugin the stack does not know, written against the ``Plugin`` Protocol alone
(its five methods without a default), trains through the Booster and the job's step, evaluation,
mesh check and checkpoint choices ([Note: plugin hooks]); one process, GPT-nano."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from colossal import Booster
from colossal.booster import Plugin
from colossal.train import TrainConfig
from colossal.train._guard import FiniteGuard, NonFiniteError
from colossal.train._mesh import check_mesh
from colossal.train._models import resolve_model
from colossal.train._plugin import _choose_export
from colossal.train._step import _checked_loss, _evaluate
from colossal_contracts import ConfigError
from colossal_models import GPT, GPTConfig


class PlainPlugin(Plugin):
    """One process, no wrapping: only what the Protocol has no default for."""

    name = "plain"

    def __init__(self) -> None:
        self.device = torch.device("cpu")
        self.backwards = 0

    def configure(
        self, model: nn.Module, optimizer: torch.optim.Optimizer
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        return model, optimizer

    def backward(self, loss: torch.Tensor, optimizer: torch.optim.Optimizer) -> None:
        self.backwards += 1
        loss.backward()

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model

    def save_checkpoint(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, path: Path
    ) -> None:
        torch.save({"model": model.state_dict(), "opt": optimizer.state_dict()}, path / "s.pt")

    def load_checkpoint(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, path: Path
    ) -> None:
        state = torch.load(path / "s.pt", weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["opt"])


def _gpt(seed: int = 0) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = GPT(GPTConfig.preset("nano"))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 256, (4, 16), generator=g)
    return x, torch.roll(x, -1, dims=1)


def test_a_protocol_only_plugin_steps_like_plain_pytorch_through_the_job_step():
    x, y = _batch()
    ref, ref_opt = _gpt()
    ref(x, y).backward()  # the whole batch at once

    plugin = PlainPlugin()
    booster = Booster(plugin)
    model, opt = booster.boost(*_gpt())
    seen: list[float] = []
    guard = FiniteGuard(precision="fp32", lr=1e-3)

    def on_loss(loss: torch.Tensor) -> float:
        seen.append(_checked_loss(guard, 1, loss, None))
        return seen[-1]

    mean = booster.train_step(x, y, model, opt, microbatches=2, on_loss=on_loss)
    assert plugin.backwards == 2 and len(seen) == 2  # two accumulation steps, each checked
    assert mean == pytest.approx(sum(seen) / 2)
    with torch.no_grad():
        assert mean == pytest.approx(ref(x, y).item(), rel=1e-5)  # equal halves: the mean
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        assert p.grad is not None and q.grad is not None, name  # the whole batch's gradients
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=name)
    opt.step()
    ref_opt.step()
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)
    with torch.no_grad():
        want = ref(x, y).item()
    assert _evaluate(booster, model, [(x, y)], None) == pytest.approx(want, rel=1e-5)
    assert model.training  # evaluation hands the model back in train mode


def test_the_job_asks_a_protocol_only_plugin_and_gets_the_defaults(tmp_path):
    plugin = PlainPlugin()
    assert isinstance(plugin, Plugin)
    assert plugin.mesh is None and not plugin.sharded_checkpoint and plugin.lazy is None
    assert plugin.label() == "plain" and plugin.num_stages == 1 and plugin.memory_stats() == {}
    plugin.reserve_activations(lambda: pytest.fail("no budget: nothing to estimate"))
    cfg = TrainConfig.from_flags(plugin="ddp", steps=1, out=tmp_path / "run")
    _choose_export(plugin, cfg, 1)  # nothing to choose: no error
    spec = resolve_model("gpt", "nano", vocab_size=256, parallel=False, dropout=None)
    check_mesh(cfg, spec, plugin, world=3)  # data parallelism fits any world

    booster = Booster(plugin)
    model, opt = booster.boost(*_gpt())
    x, y = _batch()
    loss = booster.execute_pipeline(x, y, model, opt)  # no pipeline: forward + backward
    assert loss.requires_grad is False and plugin.backwards == 1
    opt.step()
    saved = booster.save(model, opt, tmp_path / "ckpt", step=1)  # rank 0 writes it alone
    assert saved is not None and (saved / "s.pt").is_file()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    assert booster.load(model, opt, tmp_path / "ckpt")["step"] == 1
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, before[k], rtol=0, atol=0)
    booster.close()  # the default: nothing to join


def test_a_nan_loss_stops_the_step_before_its_backward():
    plugin = PlainPlugin()
    booster = Booster(plugin)
    model, opt = booster.boost(*_gpt())
    x, y = _batch()
    guard = FiniteGuard(precision="fp32", lr=1e-3)

    def nan_loss(loss: torch.Tensor) -> float:
        return _checked_loss(guard, 3, loss * float("nan"), None)

    with pytest.raises(NonFiniteError):
        booster.train_step(x, y, model, opt, on_loss=nan_loss)
    assert plugin.backwards == 0


def test_an_object_without_the_protocols_members_is_refused():
    class Partial:  # the old five-method shape, not subclassing Plugin
        name = "partial"
        device = torch.device("cpu")

        def configure(self, model, optimizer):  # type: ignore[no-untyped-def]
            return model, optimizer

    with pytest.raises(ConfigError, match="Booster\\(plugin\\) needs a plugin object"):
        Booster(Partial())  # type: ignore[arg-type]
