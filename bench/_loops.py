"""Set-up and timing loops shared by the benchmark scripts: the environment Spark needs,
writer processes appending 1-row batches to one table (``bench_small_appends``,
``bench_identity``, ``bench_zookeeper``'s appends), and Structured Streaming queries run to
the end (``bench_stream_source``, ``bench_deltaspark_stream``)."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench._common import cpu_seconds

ROOT = Path(__file__).resolve().parents[1]  # the repository root

#: One append of a batch; returns the slot claims it lost before committing.
Append = Callable[[Any], int]


@dataclass
class AppendRun:
    """One run of ``writers`` processes appending to a fresh table."""

    config: str
    writers: int
    ok: int
    failed: int
    seconds: float
    errors: Counter[str] = field(default_factory=Counter)
    version: int = -1
    rows: int = -1
    retries: int = 0
    cpu: float = 0.0  # CPU seconds of the writer processes during their append loops

    @property
    def commits_per_s(self) -> float:
        return self.ok / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class AppendLoop:
    """What one writer's append loop did: wall clock at its start and end (``perf_counter``,
    CLOCK_MONOTONIC on Linux: comparable across processes), appends that succeeded, failures
    by exception type, slot claims lost, and CPU seconds."""

    start: float
    end: float
    ok: int
    errors: dict[str, int]
    retries: int
    cpu: float


def timed_appends(
    batches: Iterable[Any], append: Append, *, cpu_clock: Callable[[], float] = cpu_seconds
) -> AppendLoop:
    """Append every batch in turn; an exception counts as a failed append, not as an error."""
    errors: Counter[str] = Counter()
    ok = retries = 0
    start = time.perf_counter()
    cpu = cpu_clock()
    for batch in batches:
        try:
            retries += append(batch)
            ok += 1
        except Exception as exc:
            errors[type(exc).__name__] += 1
    end = time.perf_counter()
    return AppendLoop(start, end, ok, dict(errors), retries, cpu_clock() - cpu)


def setup_failed(barrier: Any, exc: BaseException, appends: int) -> dict[str, int]:
    """A writer's set-up raised: abort the barrier (rather than hang the other writers) and
    count its ``appends`` as failed by set-up."""
    barrier.abort()
    return {f"setup:{type(exc).__name__}: {exc}": appends}


def deltalake_append(path: str) -> Append:
    """An append to the delta-rs table at ``path``."""
    from deltalake import write_deltalake

    def append(batch: Any) -> int:
        write_deltalake(path, batch, mode="append")
        return 0  # delta-rs retries internally and does not report it

    return append


def run_writers(worker: Callable[..., None], args: Sequence[Any], writers: int) -> list[Any]:
    """``writers`` processes (``spawn``) each run ``worker(*args, w, barrier, results)``;
    returns the row each put on ``results``, once all have exited."""
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(writers), ctx.Queue()
    procs = [ctx.Process(target=worker, args=(*args, w, barrier, results)) for w in range(writers)]
    for p in procs:
        p.start()
    rows = [results.get(timeout=900) for _ in procs]
    for p in procs:
        p.join()
    return rows


def deltalake_notes(results: dict[tuple[str, int], list[Any]]) -> None:
    """Print the delta-rs runs whose table does not hold one version and one row per append."""
    for writers in (1, 4):
        for r in results[("deltalake", writers)]:
            if r.version != r.ok or r.rows != r.ok:
                print(f"note: deltalake {writers} writer(s): version {r.version}, rows {r.rows}, ok {r.ok}")


def spark_env() -> None:
    """Set before the first SparkSession: Spark's Python workers find the repository
    (``pyspark_eventlog``'s auto-registration) on PYTHONPATH, Spark binds to loopback, and its
    Python workers run this interpreter."""
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


@contextlib.contextmanager
def available_now(df: Any, checkpoint: str, source: str, timeout: float) -> Iterator[Any]:
    """Start the availableNow query of streaming ``df`` into ``noop``; the body runs once it has
    terminated (TimeoutError after ``timeout`` seconds), and the query is stopped after it."""
    query = (
        df.writeStream.format("noop")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    try:
        if not query.awaitTermination(timeout):
            raise TimeoutError(f"{source} did not finish in {timeout} s")
        yield query
    finally:
        query.stop()
