"""Ranks that die with their launcher, and runs that stop cleanly on SIGINT/SIGTERM.

[Note: parent-death signal] ``colossal run`` puts its own pid in ``COLOSSAL_LAUNCHER_PID``; each
rank it starts asks the kernel (``prctl(PR_SET_PDEATHSIG, SIGKILL)``) to be killed when its parent
dies, then checks that its parent is still that launcher (it may have died before the call). A
launcher killed with SIGKILL thus takes its ranks with it, and no rank keeps writing into
``--out`` for a later run to race (the run lock, [Note: run lock], is released with them). The
atomic publish of checkpoints ([Note: atomic checkpoints]) keeps every complete checkpoint.
Linux only; elsewhere a no-op.

[Note: stopping a run] SIGINT and SIGTERM raise ``RunStopped`` in the main thread of a training
process: the step in progress is abandoned, no save starts, the checkpoints already published
stay, and the command prints one line (exit status 1). Under ``colossal run`` the launcher passes
either signal to every rank and prints its own line.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

from colossal_contracts import ColossalError

__all__ = ["LAUNCHER_ENV", "RunStopped", "die_with_launcher", "stop_on_signals"]

LAUNCHER_ENV = "COLOSSAL_LAUNCHER_PID"
_PR_SET_PDEATHSIG = 1


class RunStopped(ColossalError):
    """The run was stopped by a signal (SIGINT, SIGTERM); checkpoints already saved are kept."""


def die_with_launcher() -> bool:
    """In a rank started by ``colossal run``: be SIGKILLed when the launcher dies (see
    [Note: parent-death signal]); True when armed. Exits at once when the launcher is gone."""
    launcher = os.environ.pop(LAUNCHER_ENV, "")  # this process's children are not ranks
    if not sys.platform.startswith("linux") or not launcher.isdigit():
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() != int(launcher):  # the launcher died before the call: follow it now
        os._exit(1)
    return True


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


@contextlib.contextmanager
def stop_on_signals(rank: int, world: int) -> Iterator[None]:
    """While inside: SIGINT and SIGTERM raise ``RunStopped`` (main thread only; see
    [Note: stopping a run]). The previous handlers come back on the way out."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stopped(signum: int, _frame: Any) -> None:
        who = f"rank {rank}" if world > 1 else "the run"
        raise RunStopped(
            f"{who} stopped by {_signal_name(signum)}; checkpoints already saved are kept: "
            "continue with --resume"
        )

    # under torchrun SIGTERM is the launcher's, answered by [Note: peer heartbeats]
    mine = (
        (signal.SIGINT,) if "TORCHELASTIC_RUN_ID" in os.environ else (signal.SIGINT, signal.SIGTERM)
    )
    previous = {s: signal.signal(s, stopped) for s in mine}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
