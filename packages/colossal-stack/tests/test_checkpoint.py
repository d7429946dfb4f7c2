import pytest
import torch

from colossal import Booster, latest_checkpoint
from colossal_contracts import CheckpointError
from colossal_models import GPT, GPTConfig


def _model_and_opt(seed):
    torch.manual_seed(seed)
    model = GPT(GPTConfig.preset("nano"))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randint(0, 256, (2, 8)), torch.randint(0, 256, (2, 8))).backward()
    opt.step()
    return model, opt


def test_round_trip_restores_weights_and_optimizer(tmp_path):
    booster = Booster()
    model, opt = _model_and_opt(0)
    booster.save(model, opt, tmp_path, step=1)
    other, other_opt = _model_and_opt(1)
    info = booster.load(other, other_opt, tmp_path)
    assert info["step"] == 1
    for (n, a), (_, b) in zip(model.state_dict().items(), other.state_dict().items()):
        assert torch.equal(a, b), n
    assert other.wte.weight.data_ptr() != 0 and other.wte.weight is other.wte.weight
    sa, sb = opt.state_dict()["state"], other_opt.state_dict()["state"]
    for pid in sa:
        assert torch.equal(sa[pid]["exp_avg"], sb[pid]["exp_avg"])
        assert float(sa[pid]["step"]) == float(sb[pid]["step"])


def test_failed_save_leaves_the_previous_checkpoint_loadable(tmp_path):
    booster = Booster()
    model, opt = _model_and_opt(0)
    booster.save(model, opt, tmp_path, step=1)

    class Broken(RuntimeError):
        pass

    def explode(*_a, **_k):
        raise Broken("disk full")

    original = booster.plugin.save_checkpoint
    booster.plugin.save_checkpoint = explode  # type: ignore[method-assign]
    with pytest.raises(Broken):
        booster.save(model, opt, tmp_path, step=2)
    booster.plugin.save_checkpoint = original  # type: ignore[method-assign]
    assert latest_checkpoint(tmp_path).name == "step-1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step-1"]
    fresh, fresh_opt = _model_and_opt(3)
    assert booster.load(fresh, fresh_opt, tmp_path)["step"] == 1


def test_corrupt_checkpoint_is_a_clear_error(tmp_path):
    booster = Booster()
    model, opt = _model_and_opt(0)
    path = booster.save(model, opt, tmp_path, step=1)
    (path / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match="corrupt"):
        booster.load(model, opt, tmp_path)


def test_checkpoint_of_another_preset_is_refused(tmp_path):
    booster = Booster()
    model, opt = _model_and_opt(0)
    booster.save(model, opt, tmp_path, step=1)
    bigger = GPT(GPTConfig.preset("micro"))
    with pytest.raises((CheckpointError, RuntimeError)):
        booster.load(bigger, torch.optim.AdamW(bigger.parameters()), tmp_path)


def test_no_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match=r"no usable checkpoint .*no step-N directory"):
        latest_checkpoint(tmp_path)
