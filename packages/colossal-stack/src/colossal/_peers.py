"""Noticing that another rank died, and saying which, instead of a raw socket error or a hang.

[Note: peer heartbeats] Every rank of a multi-rank run bumps a counter ``colossal/alive/<rank>``
in the rendezvous store (torchrun's agent store, or the one rank 0 hosts under ``env://``) four
times a second from a daemon thread, over its own store connection. When a collective fails with a
backend error (gloo's "Connection closed by peer" when a peer's process is gone), the rank reads
every counter, waits a few heartbeats and reads again: ranks whose counter did not move are dead,
and ``RankFailedError`` names them. A store that cannot be reached at all means its host died
(rank 0 under ``env://``). Under torchrun the launcher also stops survivors with SIGTERM; that
becomes the same one-line error instead of a silent exit.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from colossal_contracts import DistributedError

from ._watchdog import Watchdog, frozen_limit

__all__ = ["PeerWatch", "RankFailedError", "watch_peers"]

_BEAT_S = 0.25
_PREFIX = "colossal/alive"


class RankFailedError(DistributedError):
    """Another rank of the run died (or was stopped); this rank stopped too."""


class PeerWatch:
    """Heartbeats of this rank, and a check of everyone's (see [Note: peer heartbeats])."""

    def __init__(self, rank: int, world: int, store: Any | None):
        self.rank, self.world, self._store = rank, world, store
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.watchdog: Watchdog | None = None  # [Note: watchdog], multi-rank runs only
        run = os.environ.get("TORCHELASTIC_RUN_ID", "env") + os.environ.get(
            "TORCHELASTIC_RESTART_COUNT", "0"
        )
        self._prefix = f"{_PREFIX}/{run}"

    def _key(self, rank: int, kind: str = "alive") -> str:
        return f"{self._prefix}/{rank}" if kind == "alive" else f"{self._prefix}/{kind}/{rank}"

    def start(self) -> None:
        if self._store is None:
            return
        self._store.add(self._key(self.rank), 1)
        self._store.set(self._key(self.rank, "where"), f"{os.getpid()}@{socket.gethostname()}")
        self.watchdog = Watchdog(
            self.rank,
            self.world,
            lambda kind, r: self._store.add(self._key(r, kind), 0),
            frozen_s=frozen_limit(os.environ),
        )
        self._thread = threading.Thread(target=self._beat, name="colossal-heartbeat", daemon=True)
        self._thread.start()

    def _where(self, rank: int) -> str | None:
        try:
            return self._store.get(self._key(rank, "where")).decode()
        except Exception:
            return None

    def _beat(self) -> None:
        published = 0
        while not self._stop.wait(_BEAT_S):
            try:
                self._store.add(self._key(self.rank), 1)
                if self.watchdog is not None:
                    steps = self.watchdog.steps
                    if steps != published:
                        self._store.add(self._key(self.rank, "steps"), steps - published)
                        published = steps
                    self.watchdog.tick(self._where)  # [Note: watchdog]
            except Exception:  # the store's host is gone
                if self.watchdog is not None and not self._stop.is_set():
                    self.watchdog.store_lost()
                return

    def step_done(self, seconds: float) -> None:
        """The main thread finished a training step (the watchdog's progress counter)."""
        if self.watchdog is not None:
            self.watchdog.step_done(seconds)

    def training_over(self) -> None:
        """The training steps ended: no stall or store check from here on."""
        if self.watchdog is not None:
            self.watchdog.finished = True

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No stall check while inside (a save or an evaluation); frozen ranks still count."""
        if self.watchdog is not None:
            self.watchdog.paused += 1
        try:
            yield
        finally:
            if self.watchdog is not None:
                self.watchdog.paused -= 1

    def stop(self) -> None:
        """Stop beating and join the thread, so it is not inside a store call when the
        interpreter shuts down ([Note: clean exit] in the Booster)."""
        self._stop.set()
        if self._thread is not None:
            with contextlib.suppress(Exception):  # finished, not frozen ([Note: watchdog])
                self._store.add(self._key(self.rank, "done"), 1)
            self._thread.join(timeout=15)  # a store call times out after 10 s
            self._thread = None

    def dead_ranks(self, *, wait_s: float = 4 * _BEAT_S) -> list[int] | None:
        """Ranks whose heartbeat stopped; None when the store itself is unreachable."""
        if self._store is None:
            return []
        try:
            before = [self._store.add(self._key(r), 0) for r in range(self.world)]
            time.sleep(wait_s)
            after = [self._store.add(self._key(r), 0) for r in range(self.world)]
        except RankFailedError:  # the launcher's SIGTERM arrived meanwhile
            raise
        except Exception:
            return None
        return [r for r in range(self.world) if r != self.rank and after[r] == before[r]]

    def explain(self, err: BaseException) -> RankFailedError | None:
        """A ``RankFailedError`` naming the dead ranks when ``err`` came from one; else None."""
        if isinstance(err, RankFailedError):
            return err
        if not isinstance(err, RuntimeError) or self._store is None:
            return None
        dead = self.dead_ranks()
        if dead is None:
            return RankFailedError(
                f"rank {self.rank}: the rendezvous store is unreachable, so the rank hosting it "
                "(rank 0 unless torchrun's agent holds it) died; this rank stops too. Restart "
                "with --resume to continue from the last checkpoint"
            )
        if not dead:
            return None
        names = ", ".join(str(r) for r in dead)
        cause = " ".join(str(err).split()).rpartition("] ")[2][:100]  # past gloo's source path
        return RankFailedError(
            f"rank {names} died (no heartbeat for {4 * _BEAT_S:g} s after a collective failed: "
            f"{cause}); rank {self.rank} stops too. See rank "
            f"{names}'s output for why, then restart with --resume from the last checkpoint"
        )


def _store_client() -> Any | None:
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not addr or not port or not port.isdigit():
        return None
    try:
        return dist.TCPStore(
            addr, int(port), is_master=False, timeout=timedelta(seconds=10), wait_for_workers=False
        )
    except Exception:  # no store to reach: heartbeats are off, errors pass through as they are
        return None


@contextlib.contextmanager
def watch_peers() -> Iterator[PeerWatch]:
    """A running ``PeerWatch`` for a multi-rank group (a no-op one otherwise); under torchrun,
    SIGTERM from the launcher raises ``RankFailedError`` in the main thread meanwhile."""
    multi = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    rank, world = (dist.get_rank(), dist.get_world_size()) if multi else (0, 1)
    watch = PeerWatch(rank, world, _store_client() if multi else None)
    watch.start()
    previous = None
    main_thread = threading.current_thread() is threading.main_thread()
    if multi and main_thread and "TORCHELASTIC_RUN_ID" in os.environ:

        def stopped(_sig: int, _frame: Any) -> None:
            raise RankFailedError(
                f"rank {rank}: stopped by the launcher (SIGTERM), which does that when another "
                "rank failed or it was stopped; the launcher's report says which"
            )

        previous = signal.signal(signal.SIGTERM, stopped)
    try:
        yield watch
    finally:
        watch.stop()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
