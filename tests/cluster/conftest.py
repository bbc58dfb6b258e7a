"""Fixtures of the cluster tests: one standalone cluster per module, the shipped project, and
child driver processes (the test process already owns a SparkContext: one per JVM).

Set ``EVENTLOG_CLUSTER_METRICS=/path/file.json`` to have the module write its measurements
(cluster start-up seconds, peak RSS per daemon/executor, driver timings) there.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support.sparkcluster import (
    LOOPBACK,
    REPO_ROOT,
    SparkStandaloneCluster,
    build_pyfiles_zip,
    cmdline,
    group_members,
    process_rss,
    write_isolated_python,
)

DRIVER = Path(__file__).resolve().parent / "driver.py"
RESULT_MARKER = "CLUSTER-RESULT "
VENV_PYTHON = REPO_ROOT / ".venv" / "bin" / "python"
METRICS_ENV = "EVENTLOG_CLUSTER_METRICS"


@dataclass(frozen=True)
class Shipping:
    """What the drivers and executors get of the project: the zip and the isolated Python."""

    zip: Path
    python: Path  # the launcher
    base_python: Path  # the interpreter it runs (the editable install is visible to it)


@dataclass
class Measurements:
    """Numbers the module reports (see the module docstring)."""

    startup_seconds: float = 0.0
    peak_rss: dict[str, int] = field(default_factory=dict)
    drivers: dict[str, dict[str, Any]] = field(default_factory=dict)

    def sample(self, cluster: SparkStandaloneCluster) -> None:
        for role, size in cluster.rss().items():
            key = "executor" if role.startswith("executor-") else role
            key = "executor-python" if role.startswith("python-") else key
            self.peak_rss[key] = max(self.peak_rss.get(key, 0), size)

    def sample_driver(self, pgid: int) -> None:
        """The JVM of a driver process group (the child driver started it)."""
        for pid, size in process_rss(group_members(pgid)).items():
            if "java" in cmdline(pid):
                self.peak_rss["driver-jvm"] = max(self.peak_rss.get("driver-jvm", 0), size)


@pytest.fixture(scope="module")
def shipping(tmp_path_factory: pytest.TempPathFactory) -> Shipping:
    """The project zip (built from the working tree now) and a Python launcher that cannot
    import the project from the editable install."""
    root = tmp_path_factory.mktemp("shipping")
    python = VENV_PYTHON if VENV_PYTHON.exists() else Path(os.environ.get("PYTHON", "python3"))
    return Shipping(
        zip=build_pyfiles_zip(root / "eventlog_tables.zip"),
        python=write_isolated_python(root / "bin", python),
        base_python=python,
    )


@pytest.fixture(scope="module")
def measurements() -> Iterator[Measurements]:
    m = Measurements()
    yield m
    target = os.environ.get(METRICS_ENV)
    if target:
        Path(target).write_text(json.dumps(m.__dict__, indent=2, sort_keys=True))


@pytest.fixture(scope="module")
def cluster(measurements: Measurements) -> Iterator[SparkStandaloneCluster]:
    """A master and two 1-core, 1 GiB workers on loopback, for the whole module."""
    with SparkStandaloneCluster(workers=2, cores_per_worker=1, memory_per_worker="1g") as c:
        measurements.startup_seconds = c.startup_seconds or 0.0
        measurements.sample(c)
        yield c


class Driver:
    """One child driver process (see ``driver.py``), its output going to files."""

    def __init__(
        self,
        cluster: SparkStandaloneCluster,
        shipping: Shipping,
        scenarios: Sequence[tuple[str, dict[str, Any]]],
        workdir: Path,
        *,
        app: str,
        cores_max: int = 2,
        executors: int = 2,
        jars: Sequence[str] = (),
    ) -> None:
        self.app = app
        workdir.mkdir(parents=True, exist_ok=True)
        config = {
            "master": cluster.master_url,
            "pyfiles": str(shipping.zip),
            "app": app,
            "cores_max": cores_max,
            "executors": executors,
            "scenarios": [list(s) for s in scenarios],
            "jars": list(jars),
        }
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_"))}
        env.update(
            # The driver gets the project the way a user ships it: the zip on its path, the
            # repository hidden by the launcher. Executors and the driver's planning workers
            # run the same launcher.
            PYTHONPATH=str(shipping.zip),
            PYSPARK_PYTHON=str(shipping.python),
            SPARK_LOCAL_IP=LOOPBACK,
        )
        self.stdout_path = workdir / f"{app}.out"
        self.stderr_path = workdir / f"{app}.err"
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                [str(shipping.python), str(DRIVER), json.dumps(config)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env=env,
                cwd=str(workdir),
                start_new_session=True,
            )

    def finish(
        self,
        timeout: float,
        cluster: SparkStandaloneCluster | None = None,
        measurements: Measurements | None = None,
    ) -> dict[str, Any]:
        """Wait (at most ``timeout`` s, sampling RSS meanwhile) and return the driver's result."""
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None:
            if time.monotonic() >= deadline:
                self.kill()
                raise AssertionError(
                    f"driver {self.app} did not finish in {timeout:.0f} s\n{self.stderr_tail()}"
                )
            if cluster is not None and measurements is not None:
                measurements.sample(cluster)
                measurements.sample_driver(self.proc.pid)
            time.sleep(0.5)
        lines = self.stdout_path.read_text(errors="replace").splitlines()
        found = [line[len(RESULT_MARKER) :] for line in lines if line.startswith(RESULT_MARKER)]
        assert self.proc.returncode == 0 and found, (
            f"driver {self.app} exited with {self.proc.returncode}\n{self.stderr_tail()}"
        )
        result: dict[str, Any] = json.loads(found[-1])
        if measurements is not None:
            measurements.drivers[self.app] = result.get("timings", {})
        return result

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                return
            self.proc.wait(timeout=10)

    def stderr_tail(self, lines: int = 40) -> str:
        text = self.stderr_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])


def scenario_ok(result: dict[str, Any], name: str) -> dict[str, Any]:
    """The result of scenario ``name``; fails the test with the driver's traceback if it raised."""
    assert name in result, f"scenario {name} did not run: {sorted(result)}"
    out: dict[str, Any] = result[name]
    assert "error" not in out, f"scenario {name} failed on the cluster:\n{out['error']}"
    return out
