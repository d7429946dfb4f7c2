"""``colossal run``: launch a colossal command or a script on many processes through torchrun.

    colossal run --nproc-per-node 2 train --steps 50
    colossal run --nnodes 2 --node-rank 0 --master-addr HOST --master-port 29500 script.py ARGS

Everything before the command (or script) is torchrun's own flags, passed through unchanged
(``python -m torch.distributed.run --help`` lists them). When a rank fails, the launcher stops
the others and this command names the rank that failed first, with exit status 1.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, NoReturn

from colossal_contracts import ConfigError

from .._lifeline import LAUNCHER_ENV

__all__ = ["COMMANDS", "launch"]

COMMANDS = ("train", "check")


def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """(torchrun flags, what each process runs): the split is at the first command or ``.py`` file."""
    for i, tok in enumerate(argv):
        if tok in COMMANDS or tok.endswith(".py"):
            return argv[:i], argv[i:]
    raise ConfigError(
        "colossal run: nothing to launch; give a command ("
        + ", ".join(COMMANDS)
        + ") or a script.py after torchrun's flags, e.g. `colossal run --nproc-per-node 2 train`"
    )


_NPROC_WORDS = ("auto", "cpu", "gpu", "xpu")
_RANK_BYTES = 512 * 2**20  # a rank's interpreter, torch and a small model, at least


def _most_ranks() -> tuple[int, str]:
    """How many ranks this machine can start, and why: 8 per CPU core (or one per accelerator),
    and no more than its available memory holds at ``_RANK_BYTES`` each."""
    import psutil
    import torch

    cores = os.cpu_count() or 1
    by_cores = max(8 * cores, torch.cuda.device_count() if torch.cuda.is_available() else 0)
    avail = int(psutil.virtual_memory().available)
    by_memory = max(1, avail // _RANK_BYTES)
    if by_memory < by_cores:
        return by_memory, f"{avail / 2**30:,.1f} GiB of memory available, about 0.5 GiB per rank"
    return by_cores, f"{cores} CPU cores"


def _flag_values(flags: list[str], names: tuple[str, ...]) -> list[str]:
    out = []
    for i, tok in enumerate(flags):
        name, eq, value = tok.partition("=")
        if name in names:
            if eq:
                out.append(value)
            elif i + 1 < len(flags):
                out.append(flags[i + 1])
            else:
                raise ConfigError(f"colossal run: {name} needs a value")
    return out


def check_flags(flags: list[str], target: list[str]) -> None:
    """``ConfigError`` for process counts and node counts torchrun would choke on, an unknown
    torchrun flag, or a script that does not exist."""
    for v in _flag_values(flags, ("--nproc-per-node", "--nproc_per_node")):
        if v not in _NPROC_WORDS and not (v.isdigit() and 1 <= int(v) <= 1024):
            raise ConfigError(
                f"colossal run: --nproc-per-node {v!r} must be a process count from 1 to 1024 "
                f"(or one of {', '.join(_NPROC_WORDS)})"
            )
        if v.isdigit():
            most, why = _most_ranks()
            if int(v) > most:
                raise ConfigError(
                    f"colossal run: --nproc-per-node {v} is more ranks than this machine can "
                    f"start ({why}); use at most {most}, or spread them over --nnodes machines"
                )
    for v in _flag_values(flags, ("--nnodes",)):
        parts = v.split(":")
        if not (1 <= len(parts) <= 2 and all(x.isdigit() and int(x) >= 1 for x in parts)):
            raise ConfigError(f"colossal run: --nnodes {v!r} must be N or MIN:MAX, positive ints")
    from torch.distributed.run import get_args_parser

    parser = get_args_parser()

    def refuse(message: str) -> NoReturn:
        raise ConfigError(f"colossal run: {message}; torchrun's flags go before the command")

    parser.error = refuse  # type: ignore[method-assign]  # torch builds the parser: raise, not exit
    parser.parse_args([*flags, "--module", "colossal"])
    if target[0].endswith(".py") and not Path(target[0]).is_file():
        raise ConfigError(f"colossal run: script {target[0]} does not exist")


def _describe(failures: dict[int, Any]) -> str:
    """Ranks killed by a signal other than the launcher's SIGTERM died first; the others stopped
    after them (they print their own one-line reason)."""
    died = {r: f for r, f in failures.items() if f.exitcode < 0 and f.signal_name() != "SIGTERM"}
    if not died:
        died = failures
    parts = []
    for rank, f in sorted(died.items()):
        how = f"killed by {f.signal_name()}" if f.exitcode < 0 else f"exit status {f.exitcode}"
        parts.append(f"rank {rank} ({how})")
    text = ", ".join(parts) + " failed first"
    rest = sorted(set(failures) - set(died))
    if rest:
        text += "; rank " + ", ".join(map(str, rest)) + " stopped after it"
    return text


def launch(argv: list[str]) -> int:
    """Run ``argv`` (torchrun's flags, then a command or script) under torchrun."""
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    flags, target = split_argv(argv)
    check_flags(flags, target)
    if target[0].endswith(".py"):
        args = [*flags, *target]
    else:
        args = [*flags, "--module", "colossal", *target]
    os.environ[LAUNCHER_ENV] = str(os.getpid())  # [Note: parent-death signal]
    try:
        torchrun(args)
    except (SignalException, KeyboardInterrupt) as exc:
        name = exc.sigval.name if isinstance(exc, SignalException) else "SIGINT"
        print(
            f"error: colossal run: stopped by {name}; every rank was stopped, and the "
            "checkpoints already saved are kept (continue with --resume)",
            file=sys.stderr,
        )
        return 130 if name == "SIGINT" else 143
    except ChildFailedError as exc:  # each rank's own error was printed by that rank
        print(
            f"error: colossal run: {_describe(exc.failures)}; the launcher stopped the others "
            "(each rank's output above says where it was)",
            file=sys.stderr,
        )
        return 1
    return 0
