"""A real Spark standalone cluster on loopback for tests: one master and N workers.

Every daemon is a JVM started with ``spark-class`` from the pyspark pip distribution, in its
own process group (executors the worker launches stay in the worker's group), bound to
127.0.0.1 on ports picked by the kernel, logging to a file under the cluster's directory.
Start-up waits until the master's JSON status page lists every worker as ALIVE, bounded by
``startup_timeout``; :meth:`SparkStandaloneCluster.stop` terminates each process group and
kills it after a grace period, and an ``atexit`` hook kills whatever is still running.

The shipping helpers build what a user gives a cluster: :func:`build_pyfiles_zip` zips the
project's packages for ``spark.submit.pyFiles``, and :func:`write_isolated_python` writes a
Python launcher that cannot import the project from the virtualenv's editable install, so
executors must get it from the zip.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from tests.support.processes import killpg, log_tail, track, untrack

__all__ = [
    "PROJECT_MODULES",
    "REPO_ROOT",
    "SparkClusterError",
    "SparkStandaloneCluster",
    "build_pyfiles_zip",
    "cmdline",
    "group_members",
    "process_rss",
    "spark_home",
    "write_isolated_python",
]

LOOPBACK = "127.0.0.1"
REPO_ROOT = Path(__file__).resolve().parents[2]
#: What executors need of this project: the four packages and the data source module.
PROJECT_MODULES = ("eventlog", "lockstore", "streaming", "spark_adapter", "pyspark_eventlog.py")
_MASTER_CLASS = "org.apache.spark.deploy.master.Master"
_WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
_POLL = 0.25
_LOG4J2 = """\
rootLogger.level = warn
rootLogger.appenderRef.stdout.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss.SSS} %p %c{1}: %m%n
logger.deploy.name = org.apache.spark.deploy
logger.deploy.level = info
"""


class SparkClusterError(RuntimeError):
    """The cluster did not start, or a daemon died."""


def spark_home() -> Path:
    """The Spark distribution inside the installed pyspark package."""
    import pyspark

    home = Path(pyspark.__file__).resolve().parent
    if not (home / "bin" / "spark-class").exists():
        raise SparkClusterError(f"no bin/spark-class in {home}: is pyspark installed from pip?")
    return home


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------------------------------------
# Process bookkeeping: tests.support.processes kills daemons still running at interpreter exit.


def process_rss(pids: Iterable[int]) -> dict[int, int]:
    """Resident set size in bytes of each pid that still exists (from ``/proc``)."""
    out: dict[int, int] = {}
    for pid in pids:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                out[pid] = int(line.split()[1]) * 1024
    return out


def group_members(pgid: int) -> list[int]:
    """The pids of process group ``pgid`` (Linux ``/proc``)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Fields after the parenthesised command: state ppid pgrp ...
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@dataclass
class _Daemon:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path


class SparkStandaloneCluster:
    """A standalone master and ``workers`` workers on 127.0.0.1.

    ``with SparkStandaloneCluster(workers=2) as cluster:`` starts it and stops it on exit,
    even when the body raises; :attr:`master_url` is what ``SparkSession.builder.master``
    takes. ``root`` (default: a new temporary directory, removed by :meth:`stop`) holds the
    daemons' logs, the workers' work directories (executor logs and fetched files) and the
    Spark configuration directory, so no user configuration leaks in.
    """

    def __init__(
        self,
        workers: int = 2,
        *,
        cores_per_worker: int = 1,
        memory_per_worker: str = "1g",
        daemon_memory: str = "256m",
        root: str | os.PathLike[str] | None = None,
        startup_timeout: float = 90.0,
        stop_grace: float = 10.0,
        env: Mapping[str, str] | None = None,
    ) -> None:
        if workers < 1:
            raise ValueError("a cluster needs at least one worker")
        self.workers = workers
        self.cores_per_worker = cores_per_worker
        self.memory_per_worker = memory_per_worker
        self.daemon_memory = daemon_memory
        self.startup_timeout = startup_timeout
        self.stop_grace = stop_grace
        self._extra_env = dict(env or {})
        self._own_root = root is None
        self.root = Path(root) if root is not None else Path(tempfile.mkdtemp(prefix="eventlog-spark-"))
        self.master_port = 0
        self.webui_port = 0
        self._daemons: list[_Daemon] = []
        #: Seconds from :meth:`start` until every worker was ALIVE (set by :meth:`start`).
        self.startup_seconds: float | None = None

    # ----------------------------------------------------------------------------- properties

    @property
    def master_url(self) -> str:
        return f"spark://{LOOPBACK}:{self.master_port}"

    @property
    def webui_url(self) -> str:
        return f"http://{LOOPBACK}:{self.webui_port}"

    @property
    def work_dirs(self) -> list[Path]:
        """Each worker's work directory (``<app id>/<executor id>`` below it per executor)."""
        return [self.root / f"worker-{i}" for i in range(self.workers)]

    @property
    def running(self) -> bool:
        return bool(self._daemons) and all(d.proc.poll() is None for d in self._daemons)

    # -------------------------------------------------------------------------- start / stop

    def start(self) -> Self:
        """Start the master and the workers; return once all workers are ALIVE.

        Raises :class:`SparkClusterError` (with the daemons' log tails) after
        ``startup_timeout`` seconds or when a daemon exits; everything started is stopped.
        """
        if self._daemons:
            raise SparkClusterError("the cluster is already started")
        began = time.monotonic()
        deadline = began + self.startup_timeout
        try:
            self._prepare()
            self.master_port, self.webui_port = _free_port(), _free_port()
            self._spawn(
                "master",
                [
                    _MASTER_CLASS,
                    "--host",
                    LOOPBACK,
                    "--port",
                    str(self.master_port),
                    "--webui-port",
                    str(self.webui_port),
                ],
            )
            self._wait(lambda s: s.get("status") == "ALIVE", deadline, "the master to be ALIVE")
            for i, work_dir in enumerate(self.work_dirs):
                work_dir.mkdir(parents=True, exist_ok=True)
                self._spawn(
                    f"worker-{i}",
                    [
                        _WORKER_CLASS,
                        "--host",
                        LOOPBACK,
                        "--cores",
                        str(self.cores_per_worker),
                        "--memory",
                        self.memory_per_worker,
                        "--work-dir",
                        str(work_dir),
                        "--webui-port",
                        "0",
                        self.master_url,
                    ],
                )
            self._wait(
                lambda s: sum(w.get("state") == "ALIVE" for w in s.get("workers", [])) == self.workers,
                deadline,
                f"{self.workers} ALIVE workers",
            )
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - began
        return self

    def stop(self) -> None:
        """SIGTERM each daemon's process group (executors included), SIGKILL after the grace
        period; then remove ``root`` if this object created it. Safe to call twice."""
        daemons, self._daemons = self._daemons, []
        # Workers first (they take their executors down), then the master.
        for daemon in reversed(daemons):
            if daemon.proc.poll() is None:
                killpg(daemon.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_grace
        for daemon in reversed(daemons):
            with contextlib.suppress(subprocess.TimeoutExpired):
                daemon.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            # The group may outlive its leader (an executor JVM): kill what is left.
            killpg(daemon.proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                daemon.proc.wait(timeout=5)
            untrack(daemon.proc.pid)
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ---------------------------------------------------------------------------- inspection

    def status(self, timeout: float = 5.0) -> dict[str, Any]:
        """The master's JSON status page (workers, cores, active and completed apps)."""
        with urllib.request.urlopen(f"{self.webui_url}/json/", timeout=timeout) as response:
            data: dict[str, Any] = json.load(response)
        return data

    def rss(self) -> dict[str, int]:
        """Resident memory in bytes by role: ``master``, ``worker-<i>``, and ``executor-<pid>``
        for each executor JVM running under a worker (Python workers of executors are
        ``python-<pid>``)."""
        out: dict[str, int] = {}
        for daemon in self._daemons:
            members = group_members(daemon.proc.pid)
            sizes = process_rss(members)
            for pid, size in sizes.items():
                cmd = cmdline(pid)
                if pid == daemon.proc.pid:
                    out[daemon.name] = size
                elif "CoarseGrainedExecutorBackend" in cmd:
                    out[f"executor-{pid}"] = size
                elif "python" in cmd:
                    out[f"python-{pid}"] = size
        return out

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of every daemon's log, for error messages."""
        return "\n".join(
            f"--- {daemon.name} ({daemon.log}) ---\n" + log_tail(daemon.log, lines)
            for daemon in self._daemons
        )

    # ------------------------------------------------------------------------------- helpers

    def _prepare(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        conf = self.root / "conf"
        conf.mkdir(exist_ok=True)
        (conf / "log4j2.properties").write_text(_LOG4J2)

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_"))}
        # The daemons and their executors must not see this repository through PYTHONPATH.
        env.pop("PYTHONPATH", None)
        env.update(
            SPARK_HOME=str(spark_home()),
            SPARK_CONF_DIR=str(self.root / "conf"),
            SPARK_LOCAL_IP=LOOPBACK,
            SPARK_DAEMON_MEMORY=self.daemon_memory,
            SPARK_LOG_DIR=str(self.root / "logs"),
            SPARK_PID_DIR=str(self.root),
        )
        env.update(self._extra_env)
        return env

    def _spawn(self, name: str, args: list[str]) -> None:
        log = self.root / f"{name}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [str(spark_home() / "bin" / "spark-class"), *args],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self._env(),
                cwd=str(self.root),
                start_new_session=True,
            )
        track(proc)
        self._daemons.append(_Daemon(name, proc, log))

    def _wait(self, ready: Any, deadline: float, what: str) -> None:
        last_error = ""
        while True:
            for daemon in self._daemons:
                if daemon.proc.poll() is not None:
                    raise SparkClusterError(
                        f"{daemon.name} exited with {daemon.proc.returncode} while waiting for {what}\n"
                        + self.log_tail()
                    )
            try:
                if ready(self.status(timeout=2.0)):
                    return
            except (OSError, urllib.error.URLError, ValueError) as exc:
                last_error = f"{type(exc).__name__}: {exc}"
            if time.monotonic() >= deadline:
                raise SparkClusterError(
                    f"timed out after {self.startup_timeout:.0f} s waiting for {what}"
                    + (f" (last error: {last_error})" if last_error else "")
                    + "\n"
                    + self.log_tail()
                )
            time.sleep(_POLL)


# ---------------------------------------------------------------------------------------------
# Shipping the project to executors


def build_pyfiles_zip(dest: str | os.PathLike[str], repo: str | os.PathLike[str] = REPO_ROOT) -> Path:
    """Zip the project's packages and ``pyspark_eventlog.py`` (sources of the working tree,
    no ``__pycache__``) into ``dest`` for ``spark.submit.pyFiles``; returns ``dest``."""
    repo, dest = Path(repo), Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as zf:
        for name in PROJECT_MODULES:
            path = repo / name
            if path.is_file():
                zf.write(path, name)
                continue
            if not (path / "__init__.py").is_file():
                raise FileNotFoundError(f"{path} is not a package")
            for file in sorted(path.rglob("*")):
                if file.is_file() and "__pycache__" not in file.parts and file.suffix != ".pyc":
                    zf.write(file, file.relative_to(repo).as_posix())
    return dest


_SITECUSTOMIZE = '''\
"""Hide the repository from this interpreter: the editable install's .pth put it on sys.path."""
import os
import sys

_hidden = {os.path.realpath(p) for p in os.environ.get("EVENTLOG_HIDDEN_PATHS", "").split(os.pathsep) if p}
sys.path[:] = [p for p in sys.path if os.path.realpath(p or os.curdir) not in _hidden]
'''


def write_isolated_python(
    directory: str | os.PathLike[str],
    python: str | os.PathLike[str],
    hidden: Iterable[str | os.PathLike[str]] = (REPO_ROOT,),
) -> Path:
    """Write ``directory/python`` (a shell launcher of ``python``) that keeps the interpreter's
    site-packages (pyarrow, pyspark, ...) but removes ``hidden`` from ``sys.path`` at start-up
    (through a ``sitecustomize`` module put first on ``PYTHONPATH``). Use it as
    ``PYSPARK_PYTHON``: the project is then importable only from what Spark ships."""
    directory = Path(directory)
    site_dir = directory / "isolate"
    site_dir.mkdir(parents=True, exist_ok=True)
    (site_dir / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    hidden_paths = os.pathsep.join(str(Path(h).resolve()) for h in hidden)
    launcher = directory / "python"
    launcher.write_text(
        "#!/bin/sh\n"
        f"EVENTLOG_HIDDEN_PATHS='{hidden_paths}'\n"
        f"PYTHONPATH='{site_dir}'\"${{PYTHONPATH:+:$PYTHONPATH}}\"\n"
        "export EVENTLOG_HIDDEN_PATHS PYTHONPATH\n"
        f"exec '{Path(python)}' \"$@\"\n"
    )
    launcher.chmod(0o755)
    return launcher
