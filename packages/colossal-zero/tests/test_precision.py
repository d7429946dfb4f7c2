"""Precisions, the dynamic loss scaler and configuration errors."""

from __future__ import annotations

import pytest
import torch

from colossal_contracts import ConfigError
from colossal_zero import GeminiConfig, LossScalerConfig
from colossal_zero.optim._precision import Precision
from colossal_zero.optim._scaler import DynamicLossScaler


def test_precisions():
    assert Precision.parse("fp32").param_dtype is torch.float32
    bf16, fp16 = Precision.parse("bf16"), Precision.parse("fp16")
    assert bf16.master and not bf16.loss_scaling and bf16.param_dtype is torch.bfloat16
    assert fp16.master and fp16.loss_scaling
    with pytest.raises(ConfigError, match="fp32, bf16, fp16"):
        Precision.parse("int8")


def test_scaler_backs_off_grows_and_floors():
    s = DynamicLossScaler(LossScalerConfig(init_scale=8.0, growth_interval=2, min_scale=2.0))
    s.update(True)
    assert s.scale == 4.0 and s.num_skipped == 1
    s.update(True)
    s.update(True)
    assert s.scale == 2.0  # floored at min_scale
    s.update(False)
    assert s.scale == 2.0
    s.update(False)
    assert s.scale == 4.0  # grew after two clean steps
    s.update(False)
    s.update(True)
    s.update(False)
    assert s.scale == 2.0  # an overflow resets the clean count
    t = DynamicLossScaler()
    t.load_state_dict(s.state_dict())
    assert t.state_dict() == s.state_dict()


@pytest.mark.parametrize(
    "kwargs",
    [{"growth_factor": 1.0}, {"backoff_factor": 1.0}, {"growth_interval": 0}, {"init_scale": 0}],
)
def test_scaler_config_errors(kwargs):
    with pytest.raises(ConfigError):
        LossScalerConfig(**kwargs)


@pytest.mark.parametrize(
    "kwargs", [{"accelerator_bytes": -1}, {"chunk_numel": 0}, {"prefetch": -1}]
)
def test_gemini_config_errors(kwargs):
    with pytest.raises(ConfigError):
        GeminiConfig(**kwargs)
