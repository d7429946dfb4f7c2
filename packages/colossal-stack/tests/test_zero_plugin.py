"""The LowLevelZero plugin (ZeRO-1/2) through the Booster and ``colossal train --plugin zero``:
trains like plain AdamW, checkpoints (sharded + a full model file plain PyTorch loads), resumes
exactly, and rejects bad settings with one-line errors."""

from __future__ import annotations

import pytest
import torch
from _boosted import LR, boost_nano, boosted_losses, fixed_batches
from _stack_reference import adamw_losses
from safetensors.torch import load_file

from colossal import LowLevelZeroPlugin, TrainConfig, train
from colossal.cli import main
from colossal_contracts import CapacityError, ConfigError
from colossal_models import GPT, GPTConfig


@pytest.mark.parametrize("stage", [1, 2])
def test_matches_plain_adamw_and_reports_model_state_bytes(stage):
    booster, model, opt = boost_nano(LowLevelZeroPlugin(stage=stage, max_grad_norm=1.0))
    torch.manual_seed(0)
    ref = GPT(GPTConfig.preset("nano"))
    want = adamw_losses(ref, fixed_batches(4), LR, clip=1.0)
    assert boosted_losses(booster, model, opt, 4) == pytest.approx(want, rel=1e-5)
    stats = booster.memory_stats()
    assert stats["optimizer_states_bytes"] >= 8 * sum(p.numel() for p in ref.parameters())


def test_checkpoint_resume_is_exact_and_full_model_loads_in_plain_torch(tmp_path):
    booster, model, opt = boost_nano(LowLevelZeroPlugin(stage=2, precision="bf16"))
    boosted_losses(booster, model, opt, 3)
    path = booster.save(model, opt, tmp_path, step=3)
    after = boosted_losses(booster, model, opt, 3, start=3)
    b2, m2, o2 = boost_nano(LowLevelZeroPlugin(stage=2, precision="bf16"), seed=5)
    assert b2.load(m2, o2, tmp_path)["step"] == 3
    assert boosted_losses(b2, m2, o2, 3, start=3) == after
    plain = GPT(GPTConfig.preset("nano"))
    plain.load_state_dict(load_file(str(path / "model.safetensors")), strict=False)
    assert all(torch.isfinite(p).all() for p in plain.parameters())


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(stage=3), ConfigError, "use GeminiPlugin"),
        (dict(stage=4), ConfigError, "unknown ZeRO stage 4"),
        (dict(precision="fp8"), ConfigError, "unknown precision"),
        (dict(host_budget="lots"), ConfigError, "cannot read 'lots' as a size"),
    ],
)
def test_bad_settings_are_one_line_errors(kwargs, error, match):
    with pytest.raises(error, match=match) as err:
        LowLevelZeroPlugin(**kwargs)
    assert "\n" not in str(err.value)


def test_offload_without_host_room_is_refused_at_boost():
    with pytest.raises(CapacityError, match="offloading the optimizer needs") as err:
        boost_nano(LowLevelZeroPlugin(offload_optimizer=True, host_budget="1KiB"))
    assert "\n" not in str(err.value)


def test_train_job_with_zero_stage_2(tmp_path, small_corpus):
    cfg = TrainConfig.from_flags(
        preset="nano", steps=6, batch_size=4, seq_len=32, corpus=small_corpus,
        out=tmp_path / "run", plugin="zero", zero_stage=2, lr=3e-3,
    )  # fmt: skip
    result = train(cfg)
    assert len(result.losses) == 6 and result.losses[-1] < result.losses[0]
    assert (result.checkpoint / "model.safetensors").is_file()
    resumed = train(cfg.replace(steps=8, resume=True))
    assert len(resumed.losses) == 2


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--plugin", "zero", "--zero-stage", "3"], "use GeminiPlugin"),
        (["--plugin", "zero", "--zero-stage", "5"], "unknown ZeRO stage 5"),
        (["--plugin", "gemini", "--zero-stage", "2"], "--zero-stage applies to --plugin zero"),
        (["--plugin", "zero", "--placement", "static"], "applies to --plugin gemini only"),
    ],
)
def test_cli_zero_flags_are_checked(argv, message, capsys, tmp_path):
    assert main(["train", *argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err and len(err.splitlines()) == 1
