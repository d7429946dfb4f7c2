"""One run per ``--out`` at a time: an advisory lock held for the run's whole life.

[Note: run lock] Rank 0 takes ``fcntl.flock(LOCK_EX | LOCK_NB)`` on ``--out/.lock`` before it
reads or writes anything else there, writes its pid into the file, and holds the lock until the
run ends; the kernel releases it when the process dies, however it dies (SIGKILL included), so
a lock is never stale. A second run (fresh or ``--resume``) into the same ``--out`` is refused
with the holder's pid while it lives. Ranks launched by ``colossal run`` die with the launcher
([Note: parent-death signal] in ``colossal._lifeline``), so "no live holder" means no rank of the
old run is still writing there. On release the file is emptied, not removed: removing a lock
file lets a third process lock a new inode while a second one holds the old.
"""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path

from colossal_contracts import ConfigError

__all__ = ["LOCK_FILE", "RunLock", "holder_pid"]

LOCK_FILE = ".lock"

try:  # POSIX; elsewhere runs are not locked
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]  # the optional-import idiom mypy has no type for


def holder_pid(out: Path) -> int | None:
    """The pid written by the holder of ``out``'s lock (None when unknown)."""
    try:
        text = (Path(out) / LOCK_FILE).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() else None


class RunLock:
    """The lock of one ``--out`` (see [Note: run lock]); ``acquire`` raises ``ConfigError``
    naming the holder's pid when another process holds it."""

    def __init__(self, out: Path):
        self.out = Path(out)
        self._fd: int | None = None
        self._made_out = False

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        if fcntl is None or self._fd is not None:
            return
        if not self.out.exists():
            try:
                self.out.mkdir(parents=True)
                self._made_out = True
            except FileExistsError:
                pass  # another run made it meanwhile: the lock decides
        path = self.out / LOCK_FILE
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as err:
            raise ConfigError(
                f"--out {self.out}: cannot open its lock file {path} ({err.strerror or err}); "
                "choose a directory you can write to"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            os.close(fd)
            if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise ConfigError(
                    f"--out {self.out}: cannot lock {path} ({err.strerror or err}); use a local "
                    "directory as --out"
                ) from None
            pid = holder_pid(self.out)
            who = f"pid {pid}" if pid else "another process"
            raise ConfigError(
                f"--out {self.out} is in use by a running colossal job ({who}); wait for it to "
                "end or stop it, or choose another --out"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self, *, undo_mkdir: bool = False) -> None:
        """Let go of the lock (emptying the file). ``undo_mkdir``: when ``acquire`` made
        ``--out`` and it holds nothing but the lock file, remove both (a run refused before it
        wrote anything leaves no trace)."""
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, 0)
        if undo_mkdir and self._made_out:
            with contextlib.suppress(OSError):
                if [p.name for p in self.out.iterdir()] == [LOCK_FILE]:
                    (self.out / LOCK_FILE).unlink()
                    self.out.rmdir()
        os.close(self._fd)  # closing the only descriptor releases the flock
        self._fd = None
