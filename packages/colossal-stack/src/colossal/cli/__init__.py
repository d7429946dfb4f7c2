"""The ``colossal`` command: ``train``, ``run``, ``profile`` and ``check``.

Errors that come from bad input (``ColossalError``) are printed as one line, with exit status 2.
"""

from __future__ import annotations

import argparse
import sys

from colossal_contracts import ColossalError

from ._check import print_check
from ._profile import add_profile_parser
from ._run import launch
from ._train import add_train_parser

__all__ = ["main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="colossal", description="Colossal: train models far larger than accelerator memory."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    add_train_parser(sub)
    run = sub.add_parser(
        "run", help="launch a command on many processes (torchrun's flags first)", add_help=False
    )
    run.set_defaults(func=None)
    add_profile_parser(sub)
    check = sub.add_parser("check", help="print what torch, devices, backends and memory are seen")
    check.set_defaults(func=lambda _a: print_check())
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] == "run":
            return launch(argv[1:])
        args = build_parser().parse_args(argv)
        return int(args.func(args) or 0)
    except ColossalError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
