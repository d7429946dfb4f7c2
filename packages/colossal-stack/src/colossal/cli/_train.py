"""``colossal train``: argument parsing for the training job."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..train import TrainConfig, train

__all__ = ["add_train_parser"]


def add_train_parser(sub: argparse._SubParsersAction) -> None:
    d = TrainConfig()
    p = sub.add_parser("train", help="train a model on a text corpus (default: Python's stdlib)")
    p.add_argument("--model", default=d.model, help="model family (default: %(default)s)")
    p.add_argument("--preset", default=d.preset, help="model size preset (default: %(default)s)")
    p.add_argument(
        "--steps", type=int, default=d.steps, help="optimizer steps (default: %(default)s)"
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=d.batch_size,
        help="sequences per step per rank (default: %(default)s)",
    )
    p.add_argument(
        "--seq-len", type=int, default=d.seq_len, help="tokens per sequence (default: %(default)s)"
    )
    p.add_argument("--seed", type=int, default=d.seed, help="random seed (default: %(default)s)")
    p.add_argument(
        "--corpus",
        type=Path,
        default=None,
        help="text file or folder (default: this Python's standard library sources)",
    )
    p.add_argument(
        "--out", type=Path, default=d.out, help="output directory (default: %(default)s)"
    )
    p.add_argument(
        "--plugin",
        default=d.plugin,
        help="training strategy: gemini, zero or ddp (default: %(default)s)",
    )
    p.add_argument(
        "--zero-stage",
        type=int,
        default=d.zero_stage,
        help="with --plugin zero: 1 shards optimizer states, 2 gradients too (default: "
        "%(default)s; stage 3 is --plugin gemini)",
    )
    p.add_argument(
        "--placement",
        default=d.placement,
        help="gemini chunk placement: auto or static (default: %(default)s)",
    )
    p.add_argument(
        "--accelerator-budget",
        default=d.accelerator_budget,
        help="gemini byte budget on the accelerator, e.g. 512MiB (default: all of it)",
    )
    p.add_argument(
        "--precision",
        default=d.precision,
        help="gemini precision: fp32, bf16 or fp16 (default: %(default)s)",
    )
    p.add_argument(
        "--lr", type=float, default=d.lr, help="peak learning rate (default: %(default)s)"
    )
    p.add_argument(
        "--checkpoint-every",
        type=int,
        default=d.checkpoint_every,
        help="save every N steps; 0 saves only at the end (default: %(default)s)",
    )
    p.add_argument("--resume", action="store_true", help="continue from the checkpoint in --out")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    cfg = TrainConfig(
        model=args.model,
        preset=args.preset,
        steps=args.steps,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        seed=args.seed,
        corpus=args.corpus,
        out=args.out,
        plugin=args.plugin,
        placement=args.placement,
        accelerator_budget=args.accelerator_budget,
        precision=args.precision,
        zero_stage=args.zero_stage,
        lr=args.lr,
        checkpoint_every=args.checkpoint_every,
        resume=args.resume,
    )
    train(cfg)
    return 0
