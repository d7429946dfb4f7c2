"""Rows of the bad-input table about runs, folders, checkpoints, models on disk and the plugins'
own checks (``test_bad_inputs`` adds them to its table), and the files they need."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from colossal import Booster, DDPPlugin, GeminiPlugin, TrainConfig
from colossal.booster import GeminiConfig, parse_bytes
from colossal.train._guard import FiniteGuard, NonFiniteError
from colossal_contracts import CheckpointError, ConfigError
from colossal_models import GPT, GPTConfig

_HOLD = (
    "import sys, time\nfrom colossal.train._runlock import RunLock\n"
    "RunLock(sys.argv[1]).acquire()\nprint('held', flush=True)\ntime.sleep(3600)\n"
)


def _tiny_hf(folder: Path, **config: Any) -> Path:
    folder.mkdir()
    base = {"model_type": "gpt2", "n_layer": 1, "n_embd": 8, "n_head": 2, "vocab_size": 300}
    base.update(bos_token_id=0, eos_token_id=0)
    (folder / "config.json").write_text(json.dumps({**base, **config}))
    return folder


def make_files(root: Path) -> tuple[dict[str, Path], list[subprocess.Popen]]:
    """The folders the rows below name, and the processes to stop afterwards."""
    (root / "dangling").symlink_to(root / "nowhere")
    killed = root / "killed"  # killed during its first save: no complete checkpoint
    (killed / "checkpoint" / "step-1").mkdir(parents=True)
    (killed / "metrics.jsonl").write_text('{"step": 1}\n')
    busy = root / "busy"
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(busy)], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    truncated = _tiny_hf(root / "hf-truncated")
    (truncated / "model.safetensors").write_bytes(b'\x10\x00\x00\x00\x00\x00\x00\x00{"a":')
    pickled = _tiny_hf(root / "hf-pickle")
    (pickled / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle")
    outside = _tiny_hf(root / "hf-outside")
    (root / "elsewhere.safetensors").write_bytes(b"")
    index = {"weight_map": {"transformer.wte.weight": "../elsewhere.safetensors"}}
    (outside / "model.safetensors.index.json").write_text(json.dumps(index))
    files = {
        "dangling": root / "dangling",
        "killed": killed,
        "busy": busy,
        "hf_strings": _tiny_hf(root / "hf-strings", n_embd="8"),
        "hf_negative": _tiny_hf(root / "hf-negative", n_layer=-2),
        "hf_truncated": truncated,
        "hf_pickle": pickled,
        "hf_outside": outside,
    }
    return files, [holder]


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.send_signal(signal.SIGKILL)
        p.wait()


TRAIN = ["train", "--preset", "nano", "--batch-size", "2", "--seq-len", "16"]
CLI_CASES = [
    ("out-empty", [*TRAIN, "--out", ""], "an empty path"),
    ("corpus-empty", [*TRAIN, "--corpus", ""], "an empty path"),
    ("out-dangling-symlink", [*TRAIN, "--out", "{dangling}"], "which does not exist"),
    ("out-name-too-long", [*TRAIN, "--out", "{root}/" + "x" * 300], "at most 255 per name"),
    ("out-in-use", [*TRAIN, "--out", "{busy}"], "in use by a running colossal job (pid"),
    ("out-in-use-fresh", [*TRAIN, "--out", "{busy}", "--resume-off"], "in use by a running"),
    ("resume-no-usable-checkpoint", [*TRAIN, "--out", "{killed}"], "pass --restart instead"),
    ("fresh-into-killed-run", [*TRAIN, "--out", "{killed}", "--resume-off"], "--restart to"),
    ("resume-and-restart", [*TRAIN, "--restart"], "exclude each other"),
    ("run-nproc-1000", ["run", "--nproc-per-node", "1000", "train"], "more ranks than this"),
    ("plan-efficiency-nan", ["plan", "--efficiency", "nan"], "--efficiency must be in (0, 1]"),
    ("plan-top-negative", ["plan", "--top", "-3"], "--top must be a positive"),
    ("plan-devices-huge", ["plan", "--devices", "1099511627776"], "--devices must be in"),
    ("plan-png-missing-folder", ["plan", "--png", "{root}/nope/x.png"], "does not exist"),
    ("plan-hf-string-sizes", ["plan", "--model", "hf:{hf_strings}"], "'n_embd' must be a"),
    ("train-hf-negative-sizes", [*TRAIN, "--model", "hf:{hf_negative}"], "'n_layer' must be"),
    ("hf-truncated-safetensors", [*TRAIN, "--model", "hf:{hf_truncated}"], "cannot load"),
    ("hf-pickle-weights", [*TRAIN, "--model", "hf:{hf_pickle}"], "cannot load the saved"),
    ("hf-index-outside", [*TRAIN, "--model", "hf:{hf_outside}"], "outside the model folder"),
    ("profile-measure-175b", ["profile", "--preset", "175b", "--mode", "measure"], "estimate"),
]


class _FullDisk(DDPPlugin):
    """DDP whose writes meet a full disk."""

    def save_checkpoint(self, model, optimizer, path):  # type: ignore[no-untyped-def]
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path / "model.safetensors"))


def _gpt_and_opt():  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("nano"))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def _save_on_a_full_disk(f: dict[str, Path]) -> None:
    booster = Booster(_FullDisk())
    booster.save(*booster.boost(*_gpt_and_opt()), f["root"] / "full-disk", step=1)


def _clip_a_non_finite_gradient() -> None:
    booster = Booster(GeminiPlugin(max_grad_norm=1.0))
    model, opt = booster.boost(*_gpt_and_opt())
    x = torch.randint(0, 256, (2, 16))
    booster.backward(model(x, x) * float("inf"), opt)
    opt.step()  # was a ZeroDivisionError in the clip
    FiniteGuard(precision="fp32", lr=1e-3).after_step(1, opt)


API_CASES = [
    ("config-out-empty", lambda f: TrainConfig.from_flags(out=""), ConfigError, "--out is empty"),
    (
        "config-corpus-empty",
        lambda f: TrainConfig.from_flags(corpus=""),
        ConfigError,
        "--corpus is empty",
    ),
    (
        "gemini-budget-nan",
        lambda f: GeminiPlugin(config=GeminiConfig(accelerator_bytes=parse_bytes(float("nan")))),
        ConfigError,
        "an int of bytes or a size",
    ),
    (
        "gemini-clip-nan",
        lambda f: GeminiPlugin(max_grad_norm=float("nan")),
        ConfigError,
        "max_grad_norm must be a finite number",
    ),
    ("ddp-bucket-negative", lambda f: DDPPlugin(bucket_cap_mb=-1), ConfigError, "bucket_cap_mb"),
    ("booster-of-a-name", lambda f: Booster("gemini"), ConfigError, "needs a plugin object"),
    ("save-full-disk", _save_on_a_full_disk, CheckpointError, "No space left on device"),
    ("clip-inf-gradient", lambda f: _clip_a_non_finite_gradient(), NonFiniteError, "norm is"),
]
