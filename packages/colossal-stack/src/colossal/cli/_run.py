"""``colossal run``: launch a colossal command or a script on many processes through torchrun.

    colossal run --nproc-per-node 2 train --steps 50
    colossal run --nnodes 2 --node-rank 0 --master-addr HOST --master-port 29500 script.py ARGS

Everything before the command (or script) is torchrun's own flags, passed through unchanged.
"""

from __future__ import annotations

import sys

from colossal_contracts import ConfigError

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


def launch(argv: list[str]) -> int:
    from torch.distributed.run import main as torchrun

    flags, target = split_argv(argv)
    if target[0].endswith(".py"):
        args = [*flags, *target]
    else:
        args = [*flags, "--module", "colossal", *target]
    try:
        torchrun(args)
    except SystemExit as exc:  # torchrun's argparse errors
        return int(exc.code or 0)
    except Exception as exc:  # ChildFailedError: torchrun already printed each rank's error
        print(f"error: colossal run: {type(exc).__name__}: a rank failed", file=sys.stderr)
        return 1
    return 0
