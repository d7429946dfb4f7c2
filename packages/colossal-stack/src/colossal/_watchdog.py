"""Stopping a job whose rank stopped progressing, naming the rank, instead of hanging.

[Note: watchdog] Each rank's heartbeat thread ([Note: peer heartbeats]) also publishes the
number of training steps the rank finished and, once a second, reads every rank's heartbeat and
step counters from the store (each rank reads all of them up to 32 ranks, its next 8 ranks in a
ring beyond). Two faults are told apart:

* frozen: a rank's heartbeat has not moved for ``frozen_s`` (``FROZEN_S`` = 30 s unless the
  environment's ``COLOSSAL_HEARTBEAT_TIMEOUT`` says otherwise; SIGSTOP, a machine that stopped
  scheduling it, a process gone). Its heartbeat is a thread of its own, so a slow step, a long
  save or a long collective never freeze it.
* store lost: under ``env://`` rank 0 hosts the store; when it stops answering during the
  training steps (its calls time out after 10 s), rank 0 is named.
* stalled: no watched rank finished a step for ``stall_s``, derived from the measured step times
  (20 median steps, at least 40 s, at most 50 s); the rank(s) with the fewest steps are named
  (the others wait for them in a collective). Armed after the first step (the first step plans
  and may be slow), paused while a rank saves or evaluates.

The rank that notices prints one line naming the culprit and ends its process (status 1, the
kernel releases the run lock; checkpoints already published are complete). A frozen rank on
the same machine is killed (SIGKILL) first, so the launcher's report names it too. Every
decision stays within a minute of the fault.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import socket
import statistics
import sys
import time
from collections.abc import Callable, Mapping

from colossal_contracts import ConfigError, DistributedError

__all__ = ["FROZEN_S", "RankStalledError", "Watchdog", "frozen_limit", "stall_limit"]

FROZEN_S = 30.0
MIN_FROZEN_S = 5.0
_CHECK_S = 1.0
_MAX_ALL = 32  # ranks read by every rank; beyond, a ring of _RING neighbours
_RING = 8


class RankStalledError(DistributedError):
    """A rank stopped progressing (frozen or stuck); the job was stopped."""


def frozen_limit(environ: Mapping[str, str]) -> float:
    """Seconds without a heartbeat before a rank is frozen: ``COLOSSAL_HEARTBEAT_TIMEOUT`` when
    set (seconds, at least ``MIN_FROZEN_S``: a loaded machine delays heartbeats by seconds),
    else ``FROZEN_S``."""
    text = environ.get("COLOSSAL_HEARTBEAT_TIMEOUT", "").strip()
    if not text:
        return FROZEN_S
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (value >= MIN_FROZEN_S and math.isfinite(value)):
        raise ConfigError(
            f"COLOSSAL_HEARTBEAT_TIMEOUT={text!r} is not a number of seconds of at least "
            f"{MIN_FROZEN_S:g}; unset it for the default {FROZEN_S:g} s"
        )
    return value


def stall_limit(step_times: list[float]) -> float:
    """Seconds without a finished step on any watched rank before the job is stopped."""
    if not step_times:
        return 50.0
    return min(50.0, max(40.0, 20 * statistics.median(step_times[-20:])))


class Watchdog:
    """One rank's view of the others' counters (see [Note: watchdog]). ``tick`` is called from
    the heartbeat thread; ``stop_job`` ends the process by default (tests pass their own)."""

    def __init__(
        self,
        rank: int,
        world: int,
        read: Callable[[str, int], int],
        *,
        stop_job: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        frozen_s: float = FROZEN_S,
    ):
        self.rank, self.world = rank, world
        self.frozen_s = frozen_s
        self._read = read  # (kind, rank) -> counter
        self._stop_job = stop_job or _exit_with_line
        self._clock = clock
        if world <= _MAX_ALL:
            self.watched = [r for r in range(world) if r != rank]
        else:
            self.watched = [(rank + k) % world for k in range(1, _RING + 1)]
        self._seen: dict[tuple[str, int], tuple[int, float]] = {}  # last value, when it moved
        self._last_check = 0.0
        self.step_times: list[float] = []
        self.steps = 0
        self.paused = 0  # > 0 while saving or evaluating
        self.finished = False  # the training steps are over
        self._own_step_at = 0.0
        self._fired = False

    def _moved(self, kind: str, r: int, now: float) -> tuple[int, float]:
        value = self._read(kind, r)
        last = self._seen.get((kind, r))
        if last is None or last[0] != value:
            last = (value, now)
            self._seen[(kind, r)] = last
        return last

    def tick(self, pids: Callable[[int], str | None] | None = None) -> None:
        """Check the counters (at most once a second); stop the job on a fault."""
        now = self._clock()
        if self._fired or now - self._last_check < _CHECK_S:
            return
        self._last_check = now
        frozen = []
        steps: dict[int, tuple[int, float]] = {}
        for r in self.watched:
            _, beat_at = self._moved("alive", r, now)
            if now - beat_at > self.frozen_s and self._read("done", r) == 0:  # not a finished rank
                frozen.append(r)
            steps[r] = self._moved("steps", r, now)
        if frozen:
            self._fired = True
            for r in frozen:
                _kill_if_local(pids(r) if pids else None)
            names = ", ".join(map(str, frozen))
            self._stop_job(
                f"rank {names} stopped responding (no heartbeat for {self.frozen_s:g} s: stopped by "
                f"a signal such as SIGSTOP, or its machine stalled); rank {self.rank} stops the "
                "job. Restart with --resume from the last checkpoint"
            )
            return
        if self.steps == 0 or self.paused or self.finished or not steps:
            return
        limit = stall_limit(self.step_times)
        steps[self.rank] = (self.steps, self._own_step_at)
        if now - max(at for _, at in steps.values()) <= limit:
            return
        self._fired = True
        fewest = min(v for v, _ in steps.values())
        behind = sorted(r for r, (v, _) in steps.items() if v == fewest)
        if len(behind) == len(steps):  # all at the same step: the counters cannot tell who
            self._stop_job(
                f"no rank finished a step for {limit:.0f} s (about 20 steps' time; all at step "
                f"{fewest}): a rank is stuck in a collective or the kernel; rank {self.rank} "
                "stops the job. Restart with --resume from the last checkpoint"
            )
            return
        names = ", ".join(map(str, behind))
        self._stop_job(
            f"rank {names} stopped progressing (no step finished for {limit:.0f} s, about 20 "
            f"steps' time; rank {names} at step {fewest}, the others past it): stuck in a "
            f"collective or the kernel; rank {self.rank} stops the job. See rank {names}'s "
            "state, then restart with --resume from the last checkpoint"
        )

    def store_lost(self) -> None:
        """The store stopped answering during training steps: its host (rank 0 under
        ``env://``; torchrun's agent, whose death takes the ranks along, otherwise) is frozen or
        gone. Outside training steps (a save, the end of the run) it means nothing here."""
        if self._fired or self.steps == 0 or self.paused or self.finished:
            return
        self._fired = True
        self._stop_job(
            f"the rendezvous store stopped answering during training, so rank 0, which hosts "
            f"it, stopped responding or died; rank {self.rank} stops the job. Restart with "
            "--resume from the last checkpoint"
        )

    def step_done(self, seconds: float) -> None:
        """The main thread finished a training step that took ``seconds``."""
        self.steps += 1
        self.step_times.append(seconds)
        self._own_step_at = self._clock()


def _kill_if_local(where: str | None) -> None:
    """SIGKILL a frozen rank ``pid@host`` when it runs on this machine."""
    if not where or "@" not in where:
        return
    pid, _, host = where.partition("@")
    if host == socket.gethostname() and pid.isdigit() and int(pid) != os.getpid():
        with contextlib.suppress(OSError):
            os.kill(int(pid), signal.SIGKILL)


def _exit_with_line(message: str) -> None:
    """End this process at once with one line: the main thread may be blocked in C++ (a
    collective waiting for the culprit) where no exception can reach it."""
    try:
        sys.stderr.write("error: " + " ".join(message.split()) + "\n")
        sys.stderr.flush()
    finally:
        os._exit(1)
