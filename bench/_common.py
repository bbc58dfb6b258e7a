"""Helpers shared by the benchmark scripts: arguments, statistics, tables, machine notes."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import resource
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa


def parse_args(
    description: str, *, default_repeat: int = 3, quick_repeat: int | None = None
) -> argparse.Namespace:
    """``--quick`` and ``--repeat N`` (default: ``default_repeat``, or ``quick_repeat`` with --quick)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run for CI (< 60 s)")
    parser.add_argument(
        "--repeat",
        type=int,
        default=None,
        help=f"runs per measurement (default {default_repeat}); the median and range are reported",
    )
    args = parser.parse_args()
    if args.repeat is None:
        args.repeat = quick_repeat if args.quick and quick_repeat is not None else default_repeat
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    return args


@dataclass(frozen=True)
class Stat:
    """Median and range of repeated measurements."""

    median: float
    low: float
    high: float
    n: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Stat:
        if not values:
            raise ValueError("no measurements")
        return cls(statistics.median(values), min(values), max(values), len(values))

    def fmt(self, spec: str = ".1f", unit: str = "") -> str:
        return f"{self.median:{spec}}{unit} [{self.low:{spec}}-{self.high:{spec}}]"


def cpu_seconds() -> float:
    """User + system CPU time of this process, all threads included."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def wall_and_cpu(fn: Callable[[], object]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process, all threads) of one call of ``fn``."""
    cpu0, wall0 = cpu_seconds(), time.perf_counter()
    fn()
    return time.perf_counter() - wall0, cpu_seconds() - cpu0


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def process_cpu() -> dict[str, float]:
    """CPU seconds so far of this process's descendants, as {"jvm": s, "python": s} (Spark).

    The JVM is the ``java`` descendant (its own threads); Python workers are the other
    descendants, counted with the workers they already reaped (``cutime``/``cstime``), plus
    the children the JVM reaped itself (its ``cutime``/``cstime``): a Python daemon or worker
    that exits between two readings would otherwise take its CPU time out of the total.
    """
    tick = os.sysconf("SC_CLK_TCK")
    out = {"jvm": 0.0, "python": 0.0}
    for name, times in descendant_ticks().values():
        if name == "java":
            out["jvm"] += (times[0] + times[1]) / tick
            out["python"] += (times[2] + times[3]) / tick
        else:
            out["python"] += sum(times) / tick
    return out


def descendant_ticks() -> dict[int, tuple[str, list[int]]]:
    """Every descendant of this process, from /proc: {pid: (command name, [utime, stime,
    cutime, cstime] in clock ticks)}, parents before their children."""
    procs: dict[int, tuple[int, str, list[int]]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                raw = f.read()
        except OSError:
            continue
        name = raw[raw.index("(") + 1 : raw.rindex(")")]
        fields = raw[raw.rindex(")") + 2 :].split()
        procs[int(entry)] = (int(fields[1]), name, [int(fields[i]) for i in (11, 12, 13, 14)])
    out: dict[int, tuple[str, list[int]]] = {}
    frontier = [os.getpid()]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, name, times) in procs.items():
            if ppid == parent and pid not in out:
                out[pid] = (name, times)
                frontier.append(pid)
    return out


def cpu_during(fn: Callable[[], object]) -> tuple[float, dict[str, float]]:
    """(wall seconds, CPU seconds of the JVM and of the Python workers) of ``fn()``."""
    before = process_cpu()
    wall = timed(fn)
    after = process_cpu()
    return wall, {k: after[k] - before[k] for k in after}


def rotated(items: Sequence[str], rep: int) -> list[str]:
    """``items`` rotated by ``rep``: each engine goes first in turn (order effects cancel out)."""
    k = rep % len(items)
    return [*items[k:], *items[:k]]


def ratio(ours: float, peer: float) -> float:
    return ours / peer if peer else float("inf")


def machine_note() -> str:
    """One line: date, cores, load average, Python and library versions."""
    try:
        with open("/proc/loadavg") as f:
            load = " ".join(f.read().split()[:3])
    except OSError:
        load = "n/a"
    versions = []
    for mod in ("pyarrow", "deltalake"):
        try:
            versions.append(f"{mod} {__import__(mod).__version__}")
        except ImportError:
            versions.append(f"{mod} missing")
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    versions.append(f"code {_code_version()}")
    return f"{now}; {os.cpu_count()} cores; loadavg {load}; Python {platform.python_version()}; " + "; ".join(
        versions
    )


def _code_version() -> str:
    """HEAD of the repository, marked dirty when eventlog/ or lockstore/ differ from it (read-only git)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        clean = subprocess.run(
            ["git", "diff-index", "--quiet", "HEAD", "--", "eventlog", "lockstore"], cwd=root, check=False
        ).returncode
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head if clean == 0 else f"{head}+dirty"


def print_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """A GitHub-flavoured Markdown table (readable on a terminal, pasteable into RESULTS.md)."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(row: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |"

    print(f"\n### {title}\n")
    print(line(cells[0]))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in cells[1:]:
        print(line(row))
    print()


def verdict(met: bool) -> str:
    return "MET" if met else "MISSED"


# The small-append workload shared by bench_small_appends and bench_zookeeper.
SMALL_SCHEMA = pa.schema([("id", pa.int64()), ("writer", pa.int32()), ("payload", pa.string())])


def small_batch(writer: int, i: int) -> pa.RecordBatch:
    """One 1-row batch with an id unique per (writer, i)."""
    return pa.RecordBatch.from_arrays(
        [
            pa.array([writer * 1_000_000 + i], pa.int64()),
            pa.array([writer], pa.int32()),
            pa.array(["x" * 10]),
        ],
        schema=SMALL_SCHEMA,
    )


def spark_session(app: str, *, driver_memory: str = "2g", **conf: str) -> Any:
    """The benchmarks' local[2] SparkSession, configured like the tests' (UTC, no UI, 4 shuffle
    partitions, console progress bars off); ``conf`` adds or overrides settings."""
    from pyspark.sql import SparkSession

    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": "4",
        "spark.driver.memory": driver_memory,
        **conf,
    }
    builder = SparkSession.builder.master("local[2]").appName(app)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
