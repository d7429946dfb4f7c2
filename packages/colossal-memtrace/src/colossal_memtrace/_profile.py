"""``profile_step``: trace and/or estimate one training step of a model factory, write reports.

The memtrace CLI (``--model package.module:factory``) and ``colossal profile`` (model presets,
in colossal-stack) both call it, so the profiling itself exists once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from torch import nn

from colossal_contracts import ConfigError

from ._estimate import estimate_step, trace_step
from ._report import plot_timeline, print_report
from ._stats import MemStats

__all__ = ["MODES", "OPTIMIZERS", "ProfileRequest", "profile_step"]

OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer] | None] = {
    "adam": torch.optim.Adam,
    "adamw": torch.optim.AdamW,
    "sgd": lambda params: torch.optim.SGD(params, lr=0.1),
    "none": None,
}
MODES = ("measure", "estimate", "both")


@dataclass(frozen=True)
class ProfileRequest:
    """What to profile.

    Attributes:
        name: label of the model in reports.
        batch: sequences per step; seq_len: tokens per sequence.
        vocab: token ids are drawn below it (None: the model's ``config.vocab_size``, else 256).
        optimizer: a key of ``OPTIMIZERS``.
        mode: "measure" a real step, "estimate" on the meta device, or "both".
        device: device of the measured step ("cpu", "cuda", "cuda:1").
        out: folder for the JSON and PNG files.
    """

    name: str
    batch: int = 4
    seq_len: int = 128
    vocab: int | None = None
    optimizer: str = "adam"
    mode: str = "both"
    device: str = "cpu"
    out: Path = Path("memtrace-out")

    def __post_init__(self) -> None:
        for k, hi in (("batch", 2**16), ("seq_len", 2**20)):
            v = getattr(self, k)
            if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= hi:
                raise ConfigError(f"--{k.replace('_', '-')} must be an int in [1, {hi}], got {v!r}")
        if self.vocab is not None and (not isinstance(self.vocab, int) or self.vocab < 1):
            raise ConfigError(f"--vocab must be a positive int, got {self.vocab!r}")
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(
                f"unknown --optimizer {self.optimizer!r}; choose one of: {', '.join(OPTIMIZERS)}"
            )
        if self.mode not in MODES:
            raise ConfigError(f"unknown --mode {self.mode!r}; choose one of: {', '.join(MODES)}")
        try:
            dev = torch.device(self.device)
        except (RuntimeError, TypeError):
            raise ConfigError(
                f"--device {self.device!r} is not a device (cpu, cuda, cuda:1)"
            ) from None
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(f"--device {self.device}: CUDA is not available; use --device cpu")
        if dev.type not in ("cpu", "cuda"):
            raise ConfigError(f"--device {self.device}: only cpu and cuda are supported")
        if Path(self.out).exists() and not Path(self.out).is_dir():
            raise ConfigError(f"--out {self.out} is a file; give a folder")


def _loss(out: Any) -> torch.Tensor:
    return out if out.dim() == 0 else out.float().sum()


def profile_step(
    factory: Callable[[], nn.Module], req: ProfileRequest, console: Console | None = None
) -> dict[str, MemStats]:
    """Profile one step of ``factory()``'s model as ``req`` asks; print a table per result and
    write ``memstats-<kind>.json`` and ``timeline-<kind>.png`` under ``req.out``."""
    console = console or Console()
    build_opt = OPTIMIZERS[req.optimizer]
    with torch.device("meta"):
        probe = factory()
    if not isinstance(probe, nn.Module):
        raise ConfigError(f"the model factory returned {type(probe).__name__}, not an nn.Module")
    vocab = req.vocab or getattr(getattr(probe, "config", None), "vocab_size", 256)

    def inputs(device: torch.device) -> Sequence[torch.Tensor]:
        g = torch.Generator().manual_seed(0)
        idx = torch.randint(0, vocab, (req.batch, req.seq_len), generator=g).to(device)
        return idx, idx.roll(-1, dims=1)

    Path(req.out).mkdir(parents=True, exist_ok=True)
    shape = {"model": req.name, "batch": req.batch, "seq_len": req.seq_len}
    shape["optimizer"] = req.optimizer
    results: dict[str, MemStats] = {}
    if req.mode in ("estimate", "both"):
        target = "cuda" if req.device.startswith("cuda") else "cpu"
        est = estimate_step(
            factory, inputs, loss_fn=_loss, build_optimizer=build_opt, target=target
        )
        results["estimate"] = type(est)(**{**est.__dict__, "extra": {**est.extra, **shape}})
    if req.mode in ("measure", "both"):
        torch.manual_seed(0)
        model = factory().to(req.device)
        opt = build_opt(model.parameters()) if build_opt is not None else None
        real = trace_step(model, inputs(torch.device(req.device)), loss_fn=_loss, optimizer=opt)
        results["measured"] = type(real)(**{**real.__dict__, "extra": {**real.extra, **shape}})
    for kind, stats in results.items():
        print_report(stats, console=console)
        js = stats.save(Path(req.out) / f"memstats-{kind}.json")
        png = plot_timeline(stats, Path(req.out) / f"timeline-{kind}.png")
        console.print(f"wrote {js} and {png}")
    if len(results) == 2:
        ratio = results["estimate"].peak_bytes() / max(1, results["measured"].peak_bytes())
        console.print(f"static estimate / measured peak = {ratio:.4f}")
    return results
