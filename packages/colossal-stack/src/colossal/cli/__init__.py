"""The ``colossal`` command: ``train``, ``run``, ``profile``, ``plan``, ``export``, ``generate``,
``check``, ``tokenizer`` and ``data``.

Errors that come from bad input (``ColossalError``, argparse's own included) are printed as one
line, ``error: ...``, with exit status 2; a run that fails on its own (nan/inf, a rank died) is the
same one line with exit status 1.
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from colossal_contracts import ColossalError, ConfigError

from .._lifeline import die_with_launcher
from ._check import print_check
from ._data import add_data_parsers
from ._export import add_export_parser, add_generate_parser
from ._plan import add_plan_parser
from ._profile import add_profile_parser
from ._run import launch
from ._train import add_train_parser

# failures of a run itself (not of its input): exit status 1
_RUN_FAILURES = ("NonFiniteError", "RankFailedError", "RunStopped", "RankStalledError")


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors raise one-line ``ConfigError`` instead of printing usage."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(f"{self.prog}: {message} (see {self.prog} --help)")


__all__ = ["main"]


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="colossal", description="Colossal: train models far larger than accelerator memory."
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    add_train_parser(sub)
    run = sub.add_parser(
        "run", help="launch a command on many processes (torchrun's flags first)", add_help=False
    )
    run.set_defaults(func=None)
    add_profile_parser(sub)
    add_plan_parser(sub)
    add_export_parser(sub)
    add_generate_parser(sub)
    check = sub.add_parser("check", help="print what torch, devices, backends and memory are seen")
    check.set_defaults(func=lambda _a: print_check())
    add_data_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] == "run":
            return launch(argv[1:])
        die_with_launcher()  # a rank of `colossal run` ([Note: parent-death signal])
        args = build_parser().parse_args(argv)
        return int(args.func(args) or 0)
    except ColossalError as err:
        print("error: " + " ".join(str(err).split()), file=sys.stderr)
        return 1 if type(err).__name__ in _RUN_FAILURES else 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
