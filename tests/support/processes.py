"""Bookkeeping shared by the test servers (ZooKeeper, Spark standalone, moto's S3): every
process they spawn is killed at interpreter exit even if a test forgot to stop it, and
:class:`Managed` gives servers their ``close()`` and context-manager behaviour.

Servers start their processes with ``start_new_session=True``, so a process's pid is also
its process group's id: :func:`killpg` reaches whatever it forked too.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

__all__ = ["Managed", "kill_all", "killpg", "launch", "log_tail", "pid_alive", "track", "untrack"]

_live: dict[int, subprocess.Popen[bytes]] = {}
_lock = threading.Lock()


def track(proc: subprocess.Popen[bytes]) -> None:
    """Kill ``proc`` at exit unless :func:`untrack` says it was stopped."""
    with _lock:
        _live[proc.pid] = proc


def launch(
    cmd: Sequence[str], *, log: Path, cwd: Path, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start ``cmd`` with its output appended to ``log`` (after a launch line), in its own
    session (a Ctrl-C aimed at pytest does not stop it mid-test, and :func:`killpg` reaches
    what it spawns), tracked until :func:`untrack`."""
    with log.open("ab") as logfile:
        logfile.write(f"\n=== launching at {time.strftime('%H:%M:%S')}: {' '.join(cmd)}\n".encode())
        logfile.flush()
        proc = subprocess.Popen(
            list(cmd),
            stdin=subprocess.DEVNULL,
            stdout=logfile,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=None if env is None else dict(env),
            start_new_session=True,
        )
    track(proc)
    return proc


def untrack(pid: int) -> None:
    with _lock:
        _live.pop(pid, None)


def killpg(pid: int, sig: signal.Signals) -> None:
    """Signal the process group led by ``pid`` (gone already is fine)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def log_tail(path: Path | None, lines: int = 40) -> str:
    """The last ``lines`` lines of a server's log file (for error messages)."""
    if path is None:
        return "(no log)"
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 64 * 1024))
            text = fh.read().decode("utf-8", errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


@atexit.register
def kill_all() -> None:
    """Kill every tracked process (at exit; callers that clean up after them call it first)."""
    with _lock:
        procs = list(_live.values())
        _live.clear()
    for proc in procs:
        if proc.poll() is None:  # only unreaped processes: a reaped pid may be reused
            killpg(proc.pid, signal.SIGKILL)
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)


def reap(proc: subprocess.Popen[bytes] | None, timeout: float) -> bool:
    """Wait up to ``timeout`` s for ``proc`` to exit and stop tracking it; True if it has
    exited (or there is none). No killpg after the wait: once reaped, the pid (the group
    id) may be reused by another process."""
    if proc is None:
        return True
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return False
    untrack(proc.pid)
    return True


class Managed(ABC):
    """Context-manager and close() behaviour shared by the test servers."""

    @abstractmethod
    def start(self) -> Self: ...

    @abstractmethod
    def stop(self) -> None: ...

    @abstractmethod
    def cleanup(self) -> None: ...

    def close(self) -> None:
        """Stop, then delete what we created (even if stopping failed)."""
        try:
            self.stop()
        finally:
            self.cleanup()

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.cleanup()  # __exit__ will not run; the exception carries the log tail
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
