"""A real S3 API for tests: moto's standalone server in its own process on a loopback port.

The server is this file run as a script (``python s3server.py serve --port N``), which starts
``moto.server`` (moto[s3], flask and flask-cors, from the ``test`` extra) in a child process of
the test run, in its own process group, bound to 127.0.0.1 on a port picked by the kernel. Being
a separate process, it is reachable from every process a test starts (writers on "other
machines"), unlike moto's in-process ``ThreadedMotoServer``. Its output goes to a log file
under a temporary directory, whose tail every start-up error carries.

Start-up waits, bounded, until an HTTP request answers; :meth:`MotoS3Server.stop` terminates
the process group and kills it after a grace period; an ``atexit`` hook kills whatever is
still running, and :func:`reap_orphans` kills servers left behind by a test run that was
itself killed.

**Conditional writes.** moto checks ``If-None-Match: *`` and then stores the object in two
steps, without a lock, while serving requests on many threads: two concurrent creators of one
key can both succeed (seen with moto 5.2.5 under a short GIL switch interval). S3 guarantees
that exactly one succeeds, and a slot store built on conditional writes relies on it. So by
default the server runs every PUT, POST and DELETE under one lock (``serialize_writes``),
which makes each write, conditional ones included, atomic; reads still run concurrently.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Self

from tests.support.processes import Managed, killpg, launch, log_tail, pid_alive, reap

__all__ = [
    "ACCESS_KEY",
    "INSTALL_HINT",
    "REGION",
    "SECRET_KEY",
    "MotoS3Server",
    "S3ServerError",
    "S3ServerUnavailable",
    "check_prerequisites",
    "reap_orphans",
    "start_s3_server_for_tests",
]

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
#: Fake credentials: moto accepts any; they must never be real ones.
ACCESS_KEY = "testing"
SECRET_KEY = "testing"
#: moto's default region (buckets created without a LocationConstraint live here).
REGION = "us-east-1"
DIR_PREFIX = "eventlog-s3-"
INSTALL_HINT = (
    "Install moto's standalone server with ./scripts/bootstrap.sh (the project's 'test' extra "
    "has moto[s3], flask and flask-cors), or: pip install -e '.[test]'"
)
_SCRIPT = Path(__file__).resolve().with_name("moto_serve.py")  # runs the server process
_POLL = 0.05


class S3ServerError(RuntimeError):
    """The server did not start, or did not stop."""


class S3ServerUnavailable(S3ServerError):
    """moto's server (or its web framework) is not installed."""


def check_prerequisites() -> None:
    """Raise S3ServerUnavailable, saying what to install, unless ``moto[server]`` is importable."""
    missing = [name for name in ("moto", "flask", "werkzeug") if importlib.util.find_spec(name) is None]
    if missing:
        raise S3ServerUnavailable(
            f"cannot run a local S3 server: {', '.join(missing)} missing. {INSTALL_HINT}"
        )


# ---------------------------------------------------------------------------------------------
# Process bookkeeping: every server we spawn is killed at exit even if nobody stopped it.

_reaped = False


def reap_orphans() -> None:
    """Kill servers (and remove directories) left by earlier test runs whose process has died.

    atexit does not run when pytest itself is SIGKILLed. A directory is only touched when the
    process that created it is gone, and a pid is only killed when its command line names
    this script and that directory.
    """
    for directory in Path(tempfile.gettempdir()).glob(DIR_PREFIX + "*"):
        try:
            owner = int((directory / "owner.pid").read_text().strip())
        except (OSError, ValueError):
            continue
        if pid_alive(owner):
            continue
        pid, cmdline = _server_of(directory)
        if pid is not None and str(_SCRIPT).encode() in cmdline and str(directory).encode() in cmdline:
            killpg(pid, signal.SIGKILL)
        shutil.rmtree(directory, ignore_errors=True)


def _server_of(directory: Path) -> tuple[int | None, bytes]:
    """The pid recorded in a server directory and that process's command line, or
    (None, b"") when either is gone."""
    try:
        pid = int((directory / "server.pid").read_text().strip())
        return pid, Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None, b""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


# No proxies: the server is on loopback whatever http_proxy says.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_answers(url: str, timeout: float = 1.0) -> bool:
    """True if an HTTP server answers ``url`` with any status (4xx and 5xx included)."""
    try:
        with _DIRECT.open(url, timeout=timeout):
            return True
    except urllib.error.HTTPError:
        return True
    except (OSError, ValueError):  # URLError, refused, reset, timed out
        return False


# ---------------------------------------------------------------------------------------------
# The server


class MotoS3Server(Managed):
    """moto's S3 API in a child process on ``127.0.0.1:<port>``.

    ``with MotoS3Server() as server:`` starts it and stops it on exit; :attr:`endpoint_url`
    is what S3 clients take. ``port`` defaults to a free one picked by the kernel (start-up is
    retried on a fresh port when another process took it first). ``serialize_writes`` (see
    the module doc) makes conditional writes atomic. ``switch_interval`` sets the server
    interpreter's ``sys.setswitchinterval`` (tests shorten it to provoke races).
    ``log_requests`` keeps werkzeug's line per request in the log (off: the log holds only
    warnings and errors, with tracebacks of requests moto failed). ``persist_dir`` keeps the
    buckets in that directory, so the server can be killed and started again (:meth:`start`
    after :meth:`kill`, on the same ``port``) with its objects: see ``--persist`` in
    tests/support/moto_serve.py for what is kept and how (moto itself keeps them in memory).
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        start_timeout: float = 30.0,
        stop_timeout: float = 10.0,
        serialize_writes: bool = True,
        switch_interval: float | None = None,
        log_requests: bool = False,
        persist_dir: Path | None = None,
        python: str = sys.executable,
    ) -> None:
        self._explicit_port = port is not None
        self.port = port if port is not None else _free_port()
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.serialize_writes = serialize_writes
        self.switch_interval = switch_interval
        self.log_requests = log_requests
        self.persist_dir = persist_dir
        self.python = python
        self.dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        #: Seconds from launch until the server answered (set by :meth:`start`).
        self.startup_seconds: float | None = None

    # -- addresses and files ---------------------------------------------------------------

    @property
    def endpoint_url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def log_path(self) -> Path | None:
        return self.dir / "server.log" if self.dir is not None else None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the server's output (for error messages)."""
        return log_tail(self.log_path, lines)

    def _error(self, message: str) -> S3ServerError:
        return S3ServerError(f"{message}\n--- last lines of {self.log_path} ---\n{self.log_tail()}")

    # -- life cycle ------------------------------------------------------------------------

    def _command(self) -> list[str]:
        assert self.dir is not None
        # -P: keep this script's directory (tests/support) off the server's sys.path.
        cmd = [self.python, "-P", str(_SCRIPT), "serve", "--port", str(self.port), "--dir", str(self.dir)]
        if self.serialize_writes:
            cmd.append("--serialize-writes")
        if self.switch_interval is not None:
            cmd += ["--switch-interval", repr(self.switch_interval)]
        if self.log_requests:
            cmd.append("--log-requests")
        if self.persist_dir is not None:
            cmd += ["--persist", str(self.persist_dir)]
        return cmd

    def _launch(self) -> None:
        if self.is_running():
            raise S3ServerError(f"the S3 server on {self.endpoint_url} is already running (pid {self.pid})")
        global _reaped
        if not _reaped:
            _reaped = True
            reap_orphans()
        if self.dir is None:
            self.dir = Path(tempfile.mkdtemp(prefix=DIR_PREFIX))
            (self.dir / "owner.pid").write_text(f"{os.getpid()}\n")
        assert self.log_path is not None
        cmd = self._command()
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        proc = launch(cmd, log=self.log_path, cwd=self.dir, env=env)
        self._proc = proc
        (self.dir / "server.pid").write_text(f"{proc.pid}\n")

    def _wait_until_serving(self) -> float:
        started = time.monotonic()
        deadline = started + self.start_timeout
        while True:
            if not self.is_running():
                code = self._proc.returncode if self._proc is not None else None
                raise self._error(f"the S3 server for {self.endpoint_url} exited (rc {code})")
            if http_answers(self.endpoint_url + "/", timeout=1.0):
                return time.monotonic() - started
            if time.monotonic() >= deadline:
                raise self._error(
                    f"the S3 server on {self.endpoint_url} did not answer within {self.start_timeout:.0f} s"
                )
            time.sleep(_POLL)

    def _port_clash(self) -> bool:
        return "Address already in use" in self.log_tail(200)

    def start(self) -> Self:
        """Start the server and wait until it answers HTTP; raise S3ServerError (with the log
        tail) when it exits or does not answer within ``start_timeout`` seconds."""
        check_prerequisites()
        for attempt in range(3):
            self._launch()
            try:
                self.startup_seconds = self._wait_until_serving()
                return self
            except S3ServerError:
                retry = not self._explicit_port and self._port_clash()
                self.kill()
                if not retry or attempt == 2:
                    raise
                self.port = _free_port()
            except BaseException:
                self.kill()
                raise
        raise AssertionError("unreachable")

    def _reap(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the server to exit; True if it has (or there is none)."""
        return reap(self._proc, timeout)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if the server has not exited after ``stop_timeout`` seconds."""
        if self._proc is not None and self._proc.poll() is None:
            killpg(self._proc.pid, signal.SIGTERM)
        if not self._reap(self.stop_timeout):
            log.warning(
                "S3 server pid %s ignored SIGTERM for %.0f s; killing it", self.pid, self.stop_timeout
            )
            self.kill()

    def kill(self) -> None:
        """SIGKILL the server."""
        if self._proc is not None and self._proc.poll() is None:
            killpg(self._proc.pid, signal.SIGKILL)
        if not self._reap(10.0):
            raise S3ServerError(f"S3 server pid {self.pid} survived SIGKILL for 10 s")

    def cleanup(self) -> None:
        """Kill the server if still running and delete its directory (and log)."""
        if self.is_running():
            self.kill()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.is_running() else "stopped"
        return f"<MotoS3Server {self.endpoint_url} {state}>"


def start_s3_server_for_tests(*, timeout: float = 30.0) -> tuple[str, Callable[[], None]]:
    """Start the S3 server the test suite shares; return (endpoint URL, stop).

    Raises S3ServerUnavailable (with install instructions) when moto[server] is missing, and
    S3ServerError (with the server's output) when it does not start within ``timeout`` s.
    """
    server = MotoS3Server(start_timeout=timeout)
    try:
        server.start()
    except BaseException:
        server.cleanup()
        raise
    return server.endpoint_url, server.close
