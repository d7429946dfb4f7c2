"""Every plugin on a real CUDA device (``-m gpu``; skipped without CUDA; part of
``benchmarks/gpu_check.sh``, see docs/gpu.md).

One device: ``colossal train`` with each plugin on one process trains GPT nano on the GPU to the
losses of plain single-process AdamW on the CPU (within ``GPU_TOL``: CUDA's kernels sum in
another order than the CPU's; TF32 is turned off), and after a Booster step every tensor of the
model, optimizer and plugin is on the GPU (``misplaced`` of the meta placement suite). Two
devices: ``colossal run --nproc-per-node 2 train`` over NCCL with tp, pp, ring sp and ZeRO-2
matches the same reference.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from _checks_train_mesh import reference_losses
from _meta_device import misplaced

from colossal import (
    Booster,
    DDPPlugin,
    HybridParallelPlugin,
    LowLevelZeroPlugin,
    TrainConfig,
    train,
)
from colossal_models import GPT, GPTConfig

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

GPU_TOL = 1e-4  # relative, per step's loss: fp32 on CUDA against fp32 on the CPU
STEPS, B, T = 3, 4, 32

# name -> TrainConfig settings on one process
ONE_DEVICE = {
    "ddp": {"plugin": "ddp"},
    "zero1": {"plugin": "zero", "zero": 1},
    "zero2": {"plugin": "zero", "zero": 2},
    "gemini": {"plugin": "gemini"},
    "hybrid": {"plugin": "hybrid"},
    "hybrid-zero1": {"plugin": "hybrid", "zero": 1},
}
# name -> (flags of `colossal run --nproc-per-node 2 train`, data-parallel size)
TWO_DEVICES = {
    "tp2": (["--tp", "2"], 1),
    "pp2": (["--pp", "2", "--microbatches", "2"], 1),
    "ring-sp2": (["--sp", "ring", "--sp-size", "2"], 1),
    "zero2-dp2": (["--plugin", "zero", "--zero", "2"], 2),
}


@pytest.fixture(autouse=True)
def _no_tf32():
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def _close(got: list[float], want: list[float]) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert abs(a - b) <= GPU_TOL * abs(b), (got, want)


@pytest.mark.parametrize("name", list(ONE_DEVICE))
def test_each_plugin_trains_on_one_gpu_as_adamw_on_the_cpu(tmp_path, small_corpus, name):
    base = {"preset": "nano", "steps": STEPS, "batch_size": B, "seq_len": T}
    kw = {**base, **ONE_DEVICE[name], "corpus": small_corpus, "out": tmp_path / name}
    torch.cuda.reset_peak_memory_stats()
    result = train(TrainConfig.from_flags(**kw))
    assert torch.cuda.max_memory_allocated() > 0  # the step ran on the GPU
    _close(result.losses, reference_losses({k: v for k, v in kw.items() if k != "out"}, 1))


@pytest.mark.parametrize(
    "cls,settings",
    [
        (DDPPlugin, {}),
        (LowLevelZeroPlugin, {"stage": 2, "precision": "bf16", "max_grad_norm": 1.0}),
        (HybridParallelPlugin, {"zero_stage": 1, "max_grad_norm": 1.0}),
    ],
)
def test_a_booster_step_leaves_nothing_on_the_host(cls, settings):
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=64, max_seq_len=16, num_layers=2, num_heads=2, hidden_size=32))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    plugin = cls(**settings)
    booster = Booster(plugin)
    model, opt = booster.boost(model, opt)
    dev = booster.device
    assert dev.type == "cuda"
    x = torch.randint(0, 64, (4, 16)).pin_memory()
    xs, ys = booster.to_device((x, x))
    loss = model(xs, ys)
    booster.backward(loss, opt)
    opt.step()
    assert not misplaced(dev, model, opt, plugin)
    if hasattr(plugin, "close"):
        plugin.close()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
@pytest.mark.parametrize("name", list(TWO_DEVICES))
def test_two_processes_over_nccl_match_adamw(tmp_path, small_corpus, name):
    flags, dp = TWO_DEVICES[name]
    out = tmp_path / name
    base = ["--preset", "nano", "--steps", str(STEPS), "--batch-size", str(B)]
    base += ["--seq-len", str(T), "--corpus", str(small_corpus), "--out", str(out)]
    cmd = [sys.executable, "-m", "colossal", "run", "--nproc-per-node", "2", "train"]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["NVIDIA_TF32_OVERRIDE"] = "0"
    done = subprocess.run(
        cmd + base + flags, env=env, capture_output=True, text=True, timeout=240, check=False
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    kw = {"preset": "nano", "steps": STEPS, "batch_size": B, "seq_len": T, "corpus": small_corpus}
    _close([r["loss"] for r in records], reference_losses(kw, dp))
