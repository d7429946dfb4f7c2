"""``python -m colossal_memtrace profile``: trace (and/or estimate) one training step of a model."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from torch import nn

from colossal_contracts import ColossalError, ConfigError

from ._estimate import estimate_step, trace_step
from ._report import plot_timeline, print_report

__all__ = ["main"]

_OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer] | None] = {
    "adam": torch.optim.Adam,
    "adamw": torch.optim.AdamW,
    "sgd": lambda params: torch.optim.SGD(params, lr=0.1),
    "none": None,
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m colossal_memtrace", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    prof = sub.add_parser("profile", help="trace one training step; print a table, write PNG+JSON")
    which = prof.add_mutually_exclusive_group(required=True)
    which.add_argument("--preset", help="a GPT preset of colossal-models (nano, tiny, small, ...)")
    which.add_argument("--model", help="package.module:factory returning an nn.Module")
    prof.add_argument("--batch", type=int, default=4, help="batch size (default 4)")
    prof.add_argument("--seq-len", type=int, default=128, help="tokens per sample (default 128)")
    prof.add_argument("--vocab", type=int, default=None,
                      help="token ids drawn below this (default: the model's vocab_size, else 256)")  # fmt: skip
    prof.add_argument("--optimizer", choices=sorted(_OPTIMIZERS), default="adam")
    prof.add_argument("--mode", choices=("measure", "estimate", "both"), default="both",
                      help="measure a real step, estimate on meta, or both (default)")  # fmt: skip
    prof.add_argument("--device", default="cpu", help="device of the measured step (default cpu)")
    prof.add_argument("--out", type=Path, default=Path("memtrace-out"), help="output folder")
    return p


def _factory(args: argparse.Namespace) -> Callable[[], nn.Module]:
    if args.preset:
        try:
            from colossal_models import GPT, GPTConfig
        except ImportError:
            raise ConfigError(
                "--preset needs colossal-models (pip install colossal-models); "
                "or pass --model package.module:factory"
            ) from None
        cfg = GPTConfig.preset(args.preset)
        return lambda: GPT(cfg)
    mod_name, _, attr = args.model.partition(":")
    if not attr:
        raise ConfigError(f"--model {args.model!r} must look like package.module:factory")
    try:
        factory = getattr(importlib.import_module(mod_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot load --model {args.model!r}: {exc}") from exc
    return factory


def _loss(out: Any) -> torch.Tensor:
    return out if out.dim() == 0 else out.float().sum()


def profile(args: argparse.Namespace, console: Console) -> int:
    if args.batch <= 0 or args.seq_len <= 0:
        raise ConfigError("--batch and --seq-len must be positive")
    factory = _factory(args)
    build_opt = _OPTIMIZERS[args.optimizer]
    with torch.device("meta"):
        probe = factory()
    vocab = args.vocab or getattr(getattr(probe, "config", None), "vocab_size", 256)
    name = args.preset or args.model

    def inputs(device: torch.device) -> Sequence[torch.Tensor]:
        g = torch.Generator().manual_seed(0)
        idx = torch.randint(0, vocab, (args.batch, args.seq_len), generator=g).to(device)
        return idx, idx.roll(-1, dims=1)

    args.out.mkdir(parents=True, exist_ok=True)
    shape = {
        "model": name,
        "batch": args.batch,
        "seq_len": args.seq_len,
        "optimizer": args.optimizer,
    }
    results = {}
    if args.mode in ("estimate", "both"):
        est = estimate_step(factory, inputs, loss_fn=_loss, build_optimizer=build_opt,
                            target="cuda" if args.device.startswith("cuda") else "cpu")  # fmt: skip
        results["estimate"] = type(est)(**{**est.__dict__, "extra": {**est.extra, **shape}})
    if args.mode in ("measure", "both"):
        torch.manual_seed(0)
        model = factory().to(args.device)
        opt = build_opt(model.parameters()) if build_opt is not None else None
        real = trace_step(model, inputs(torch.device(args.device)), loss_fn=_loss, optimizer=opt)
        results["measured"] = type(real)(**{**real.__dict__, "extra": {**real.extra, **shape}})
    for kind, stats in results.items():
        print_report(stats, console=console)
        js = stats.save(args.out / f"memstats-{kind}.json")
        png = plot_timeline(stats, args.out / f"timeline-{kind}.png")
        console.print(f"wrote {js} and {png}")
    if len(results) == 2:
        ratio = results["estimate"].peak_bytes() / max(1, results["measured"].peak_bytes())
        console.print(f"static estimate / measured peak = {ratio:.4f}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    console = Console()
    try:
        return profile(args, console)
    except ColossalError as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
