"""The test run's single Spark Connect session, on a Connect server in its own process.

A Connect session cannot share the test process with the classic ``spark`` fixture:
``SparkSession.builder.remote("local[2]")`` starts the server inside the caller's JVM and
refuses with ``SESSION_ALREADY_EXIST`` once a classic session runs there. So the server is
``spark-submit --class org.apache.spark.sql.connect.service.SparkConnectServer`` from
pyspark's own package (what ``sbin/start-connect-server.sh`` runs, minus its daemonizing),
on a free port, with the classic fixture's settings; the tests reach it with
``pyspark.sql.connect.session.SparkSession.builder.remote("sc://127.0.0.1:<port>")``. Its
Python workers run this interpreter, whose editable install puts the repository root
(``pyspark_eventlog.py``, so the ``eventlog`` data source) on their path.

Two sessions in one process: the generic ``SparkSession.builder.remote(...)`` refuses
(``SESSION_ALREADY_EXIST``) while the classic session runs, so the Connect builder is used
directly. What makes ``pyspark.sql.functions`` build Connect columns is the environment
variable ``SPARK_CONNECT_MODE_ENABLED`` (``pyspark.sql.utils.is_remote``), which
``builder.remote`` sets for the rest of the process; here :func:`connect_mode` sets it for one
test only (``tests/spark_connect/conftest.py``), so the classic tests that run after them still
get classic columns.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import launch, log_tail, reap

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
START_TIMEOUT_S = 150.0  # a JVM start on 2 shared cores: ~20 s measured (tests allow 300 s)
STOP_TIMEOUT_S = 30.0

SERVER_CONF = {
    "spark.ui.enabled": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.driver.memory": "1g",
    "spark.sql.python.filterPushdown.enabled": "true",
    "spark.sql.shuffle.partitions": "4",
}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return True
    except OSError:
        return False


class ConnectServer:
    """A local[2] Spark Connect server process; ``start()`` returns once its port answers."""

    def __init__(self, **conf: str) -> None:
        import pyspark

        self.spark_home = Path(pyspark.__file__).parent
        self.conf = {**SERVER_CONF, **conf}
        self.port = _free_port()
        self.workdir = Path(tempfile.mkdtemp(prefix="eventlog-connect-"))
        self.log = self.workdir / "server.log"
        self.proc: Any = None

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    def start(self) -> ConnectServer:
        env = dict(os.environ)
        env.update(
            SPARK_HOME=str(self.spark_home),
            PYSPARK_PYTHON=sys.executable,
            SPARK_LOCAL_IP="127.0.0.1",
            SPARK_CONNECT_MODE="0",
        )
        env.pop("SPARK_REMOTE", None)
        env.pop("SPARK_CONNECT_MODE_ENABLED", None)
        cmd = [str(self.spark_home / "bin" / "spark-submit"), "--class", SERVER_CLASS, "--master", "local[2]"]
        cmd += ["--name", "eventlog-tests-connect"]
        for key, value in {**self.conf, "spark.connect.grpc.binding.port": str(self.port)}.items():
            cmd += ["--conf", f"{key}={value}"]
        self.proc = launch(cmd, log=self.log, cwd=self.workdir, env=env)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _listening(self.port):
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"Spark Connect server exited ({self.proc.returncode}):\n{log_tail(self.log)}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"Spark Connect server not up in {START_TIMEOUT_S:.0f} s:\n{log_tail(self.log)}"
                )
            time.sleep(0.5)
        return self

    def stop(self) -> None:
        """SIGTERM (the server's shutdown hook stops its SparkContext), SIGKILL after
        ``STOP_TIMEOUT_S``."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            if not reap(proc, STOP_TIMEOUT_S):
                os.killpg(proc.pid, signal.SIGKILL)
                reap(proc, STOP_TIMEOUT_S)
        else:
            reap(proc, 0)

    def cleanup(self) -> None:
        shutil.rmtree(self.workdir, ignore_errors=True)


CONNECT_MODE_ENV = "SPARK_CONNECT_MODE_ENABLED"


@contextmanager
def connect_mode() -> Iterator[None]:
    """``pyspark.sql.utils.is_remote()`` is true inside (as in a Connect client process), and
    as before after."""
    before = os.environ.get(CONNECT_MODE_ENV)
    os.environ[CONNECT_MODE_ENV] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(CONNECT_MODE_ENV, None)
        else:
            os.environ[CONNECT_MODE_ENV] = before


@pytest.fixture(scope="session")
def connect_spark() -> Iterator[Any]:
    """A Spark Connect session (``pyspark.sql.connect.session.SparkSession``) on a local[2]
    Connect server started for this test run, with the classic fixture's settings (UTC,
    Python filter pushdown, 4 shuffle partitions); server and session stop at the end."""
    # pyspark checks the connect extra's packages (grpcio, ...) when this module loads.
    pytest.importorskip("pyspark.sql.connect.session", reason="needs the connect extra", exc_type=ImportError)
    from pyspark.sql.connect.session import SparkSession

    server = ConnectServer()
    try:
        server.start()
        with connect_mode():
            session = SparkSession.builder.remote(server.url).create()
        try:
            yield session
        finally:
            session.stop()
    finally:
        try:
            server.stop()
        finally:
            server.cleanup()
