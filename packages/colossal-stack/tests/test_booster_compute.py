"""Booster.compute(): bf16 CPU matmuls computed in fp32 where the setting (or the CPU) says so,
around the job's forward and backward, announced in one line ([Note: cpu matmul])."""

from __future__ import annotations

import io

import pytest
import torch
from rich.console import Console

from colossal import TrainConfig, train
from colossal.booster import Booster, DDPPlugin, GeminiConfig, GeminiPlugin
from colossal.plan._calibrate import calibrate
from colossal_zero import MATMUL_ENV, Fp32Matmul

NOTE = "bf16 matmuls computed in fp32 on this CPU"


def test_compute_follows_the_plugin_precision_and_the_setting(monkeypatch):
    monkeypatch.setenv(MATMUL_ENV, "fp32")
    bf16 = Booster(GeminiPlugin(config=GeminiConfig(precision="bf16")))
    assert bf16.matmul_note == NOTE
    assert isinstance(bf16.compute(), Fp32Matmul)
    for fp32 in (
        Booster(GeminiPlugin(config=GeminiConfig(precision="fp32"))),
        Booster(DDPPlugin()),
    ):
        assert fp32.matmul_note is None  # fp32 runs are never touched
        assert not isinstance(fp32.compute(), Fp32Matmul)
    monkeypatch.setenv(MATMUL_ENV, "native")
    native = Booster(GeminiPlugin(config=GeminiConfig(precision="bf16")))
    assert native.matmul_note is None and not isinstance(native.compute(), Fp32Matmul)


def test_compute_is_decided_once_per_booster(monkeypatch):
    monkeypatch.setenv(MATMUL_ENV, "fp32")
    booster = Booster(GeminiPlugin(config=GeminiConfig(precision="bf16")))
    monkeypatch.setenv(MATMUL_ENV, "native")
    assert isinstance(booster.compute(), Fp32Matmul)


def test_bad_setting_is_a_clear_error(monkeypatch):
    monkeypatch.setenv(MATMUL_ENV, "fastest")
    with pytest.raises(ValueError, match="COLOSSAL_CPU_MATMUL='fastest'"):
        Booster(GeminiPlugin(config=GeminiConfig(precision="bf16")))


def _run(tmp_path, corpus, setting, monkeypatch):
    monkeypatch.setenv(MATMUL_ENV, setting)
    cfg = TrainConfig.from_flags(
        preset="nano",
        steps=3,
        batch_size=4,
        seq_len=32,
        corpus=corpus,
        out=tmp_path / setting,
        plugin="gemini",
        precision="bf16",
        export="none",
    )
    out = io.StringIO()
    result = train(cfg, console=Console(file=out, width=200))
    return result.losses, out.getvalue()


def test_train_computes_bf16_in_fp32_when_asked(tmp_path, small_corpus, monkeypatch):
    calls: list[str] = []
    original = Fp32Matmul.__torch_dispatch__

    def counted(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        calls.append(func.overloadpacket.__name__)
        return original(self, func, types, args, kwargs)

    monkeypatch.setattr(Fp32Matmul, "__torch_dispatch__", counted)
    fp32, shown = _run(tmp_path, small_corpus, "fp32", monkeypatch)
    assert shown.count(NOTE) == 1
    assert {"mm", "addmm"} <= set(calls)  # forward and backward ran inside the mode
    calls.clear()
    native, shown = _run(tmp_path, small_corpus, "native", monkeypatch)
    assert NOTE not in shown and not calls
    # both accumulate in fp32 and round once: the same training within bf16 rounding
    assert all(torch.isfinite(torch.tensor(fp32)))
    assert fp32 == pytest.approx(native, rel=2e-2)


@pytest.mark.parametrize("setting", ["fp32", "native"])
def test_calibrate_times_bf16_as_training_computes_it(tmp_path, monkeypatch, setting):
    monkeypatch.setenv(MATMUL_ENV, setting)
    calls: list[str] = []
    original = Fp32Matmul.__torch_dispatch__

    def counted(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        calls.append(str(args[0].dtype))
        return original(self, func, types, args, kwargs)

    monkeypatch.setattr(Fp32Matmul, "__torch_dispatch__", counted)
    prof = calibrate(tokens=16, hidden=32, disk_dir=tmp_path, quick=True)
    assert prof["matmul_mode"] == {"fp32": "native", "bf16": setting, "fp16": setting}
    expected = {"torch.bfloat16", "torch.float16"} if setting == "fp32" else set()
    assert set(calls) == expected and all(v > 0 for v in prof["flops"].values())
