"""``python -m colossal_memtrace profile --model package.module:factory``: trace (and/or
estimate) one training step of any model. Model presets live in colossal-stack:
``colossal profile --preset tiny``.

Bad arguments are one line ``error: ...`` on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

from rich.console import Console
from torch import nn

from colossal_contracts import ColossalError, ConfigError

from ._profile import MODES, OPTIMIZERS, ProfileRequest, profile_step

__all__ = ["main"]


class _Parser(argparse.ArgumentParser):
    """argparse that raises (one line) instead of printing usage and exiting."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(f"{self.prog}: {message} (see --help)")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m colossal_memtrace", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    prof = sub.add_parser("profile", help="trace one training step; print a table, write PNG+JSON")
    which = prof.add_mutually_exclusive_group(required=True)
    which.add_argument("--model", help="package.module:factory returning an nn.Module")
    which.add_argument("--preset", help=argparse.SUPPRESS)  # moved to `colossal profile`
    prof.add_argument("--batch", type=int, default=4, help="batch size (default 4)")
    prof.add_argument("--seq-len", type=int, default=128, help="tokens per sample (default 128)")
    prof.add_argument("--vocab", type=int, default=None,
                      help="token ids drawn below this (default: the model's vocab_size, else 256)")  # fmt: skip
    prof.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default="adam")
    prof.add_argument("--mode", choices=MODES, default="both",
                      help="measure a real step, estimate on meta, or both (default)")  # fmt: skip
    prof.add_argument("--device", default="cpu", help="device of the measured step (default cpu)")
    prof.add_argument("--out", type=Path, default=Path("memtrace-out"), help="output folder")
    return p


def load_factory(spec: str) -> Callable[[], nn.Module]:
    """``package.module:factory`` -> the factory; ``ConfigError`` when it cannot be loaded."""
    mod_name, _, attr = spec.partition(":")
    if not mod_name or not attr:
        raise ConfigError(f"--model {spec!r} must look like package.module:factory")
    try:
        factory = getattr(importlib.import_module(mod_name), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(f"cannot load --model {spec!r}: {exc}") from None
    if not callable(factory):
        raise ConfigError(f"--model {spec!r} is not callable")
    return factory


def _run(argv: Sequence[str] | None, console: Console) -> int:
    args = _parser().parse_args(argv)
    if args.preset is not None:
        raise ConfigError(
            f"model presets moved to colossal-stack: run `colossal profile --preset {args.preset}`"
            ", or pass --model package.module:factory here"
        )
    factory = load_factory(args.model)
    req = ProfileRequest(
        name=args.model, batch=args.batch, seq_len=args.seq_len, vocab=args.vocab,
        optimizer=args.optimizer, mode=args.mode, device=args.device, out=args.out,
    )  # fmt: skip
    profile_step(factory, req, console)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _run(argv, Console())
    except ColossalError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
