"""Draining a table of ours: Delta Spark's streaming source versus ours, side by side.

Runs in ``.venv-delta`` (pyspark 4.2.0 with Delta Spark 4.4.0's jars, listed by
``scripts/bootstrap_delta.sh`` in ``.cache/deltaspark-jars/jars.txt``); one local[2]
SparkSession holds both sources. Two tables, written by ``Table.append`` (our writers, our
slot store), with the columns ``id bigint, value double, name string, ts timestamp, count int``:

* ``bulk``: 40 appends of 50,000 rows, one Parquet file each: 2,000,000 rows
  (``--quick``: 8 x 25,000);
* ``small``: 500 appends of 100 rows (``--quick``: 60 x 100): many small commits.

Each run is one ``trigger(availableNow=True)`` query into the ``noop`` sink with a fresh
checkpoint, timed from ``load()`` to its termination (resolving the table, planning, every
micro-batch, the offset and commit logs), with the CPU time of the JVM and of the Python
workers over the same span, process by process; the rows the query read (its progress
reports) are checked against the table. Delta Spark runs with
``spark.databricks.delta.snapshotPartitions=4`` (its default, 50, is meant for clusters).
Cases, the same options for both sources:

* ``snapshot``: no starting version, so the table as of the start (the initial snapshot) with
  the default limit (1000 files per batch), and with ``maxFilesPerTrigger`` set;
* ``commits``: ``startingVersion=1``, the commits read one by one from the log.

The sources take turns going first; each case runs ``--repeat`` times (default 5) after one
unmeasured query per source and table, reported as median [min-max]. Ratios are ours /
Delta Spark's: rows/s (> 1: ours is faster) and CPU seconds (< 1: ours uses less).

Run from the repository root:
``.venv-delta/bin/python bench/bench_deltaspark_stream.py [--quick] [--repeat N]``
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repository root

import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402

from bench._common import Stat, descendant_ticks, machine_note, parse_args, print_table, ratio, rotated  # noqa: E402
from bench._common import spark_session as bench_session  # noqa: E402
from bench._loops import available_now, spark_env  # noqa: E402
from eventlog import Table  # noqa: E402

spark_env()  # before any SparkSession

JARS_LIST = ROOT / ".cache" / "deltaspark-jars" / "jars.txt"
SOURCES = ("delta", "eventlog")
WAIT_SECONDS = 900
SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("value", pa.float64()),
        ("name", pa.string()),
        ("ts", pa.timestamp("us", tz="UTC")),
        ("count", pa.int32()),
    ]
)


@dataclass(frozen=True)
class Case:
    table: str  # "bulk" or "small"
    label: str
    options: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Run:
    wall: float
    jvm_cpu: float
    python_cpu: float
    rows: int
    batches: int

    @property
    def cpu(self) -> float:
        return self.jvm_cpu + self.python_cpu


def batch(first_id: int, n: int) -> pa.Table:
    ids = pa.array(range(first_id, first_id + n), pa.int64())
    names = pc.binary_join_element_wise("name-", pc.cast(pc.bit_wise_and(ids, 0xFFFF), pa.string()), "")
    return pa.table(
        {
            "id": ids,
            "value": pc.multiply(pc.cast(ids, pa.float64()), 0.5),
            "name": names,
            "ts": pc.cast(
                pc.add(pc.multiply(ids, 1000), 1_700_000_000_000_000), pa.timestamp("us", tz="UTC")
            ),
            "count": pc.cast(pc.bit_wise_and(ids, 1023), pa.int32()),
        },
        schema=SCHEMA,
    )


def build_table(uri: str, commits: int, rows_per_commit: int) -> int:
    """``commits`` blind appends of one file each, by our writers; returns the row count."""
    with Table.create(uri, SCHEMA) as table:
        for c in range(commits):
            table.append(batch(c * rows_per_commit, rows_per_commit))
    return commits * rows_per_commit


def delta_jars() -> list[str]:
    if not JARS_LIST.is_file():
        raise SystemExit(f"{JARS_LIST} is missing: run ./scripts/bootstrap_delta.sh")
    jars = [line.strip() for line in JARS_LIST.read_text().splitlines() if line.strip()]
    if not any(Path(j).name.startswith("delta-spark_") for j in jars) or not all(
        Path(j).is_file() for j in jars
    ):
        raise SystemExit(f"{JARS_LIST} names missing jars: run ./scripts/bootstrap_delta.sh")
    return jars


def delta_version() -> str:
    names = [Path(j).name for j in delta_jars()]
    return next(
        (n.removesuffix(".jar").rsplit("-", 1)[1] for n in names if n.startswith("delta-spark_")), "?"
    )


def session() -> Any:
    return bench_session(
        "bench-deltaspark-stream",
        **{
            "spark.jars": ",".join(delta_jars()),
            "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
            "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
            # Delta's snapshot state is shuffled into 50 partitions by default; 4 suit local[2]
            # (as spark.sql.shuffle.partitions does), and cost it less on these tables.
            "spark.databricks.delta.snapshotPartitions": "4",
        },
    )


def process_times() -> dict[int, tuple[bool, float]]:
    """CPU seconds so far of each descendant of this process: {pid: (is the JVM, seconds)},
    children it reaped included (``cutime``/``cstime``)."""
    tick = os.sysconf("SC_CLK_TCK")
    return {pid: (name == "java", sum(times) / tick) for pid, (name, times) in descendant_ticks().items()}


def cpu_between(
    before: dict[int, tuple[bool, float]], after: dict[int, tuple[bool, float]]
) -> tuple[float, float]:
    """(JVM, Python workers) CPU seconds from ``before`` to ``after``, process by process: a
    worker that exited in between counts for what its parent reaped (``bench._common``'s
    totals would lose its whole time and can go negative)."""
    jvm = python = 0.0
    for pid, (is_jvm, seconds) in after.items():
        spent = max(seconds - before.get(pid, (is_jvm, 0.0))[1], 0.0)
        if is_jvm:
            jvm += spent
        else:
            python += spent
    return jvm, python


def run_query(spark: Any, source: str, uri: str, scratch: str, options: dict[str, str]) -> Run:
    """One availableNow query of ``source`` over ``uri`` into ``noop``, timed from ``load()``
    (ours resolves the schema in a Python worker, Delta Spark reads the log) to termination."""
    checkpoint = f"{scratch}/cp-{uuid.uuid4().hex}"
    before = process_times()
    started = time.perf_counter()
    df = spark.readStream.format(source).options(**options).load(uri)
    with available_now(df, checkpoint, source, WAIT_SECONDS) as query:
        wall = time.perf_counter() - started
        jvm, python = cpu_between(before, process_times())
    progress = [p for p in query.recentProgress if p["numInputRows"]]
    rows = sum(p["numInputRows"] for p in progress)
    shutil.rmtree(checkpoint, ignore_errors=True)
    print(f"  {source:8} {dict(options)}: {wall:6.2f} s, {rows:,} rows", file=sys.stderr, flush=True)
    return Run(wall, jvm, python, rows, len({p["batchId"] for p in progress}))


def main() -> None:
    args = parse_args(__doc__ or "", default_repeat=5, quick_repeat=1)
    shapes = (
        {"bulk": (8, 25_000), "small": (60, 100)}
        if args.quick
        else {"bulk": (40, 50_000), "small": (500, 100)}
    )
    bulk_files = shapes["bulk"][0]
    cases = [
        Case("bulk", "snapshot", ()),
        Case("bulk", "snapshot", (("maxFilesPerTrigger", str(bulk_files // 10 or 1)),)),
        Case("small", "snapshot", ()),
        Case("small", "commits", (("startingVersion", "1"), ("maxFilesPerTrigger", "100"))),
    ]
    scratch = tempfile.mkdtemp(prefix="bench-deltaspark-stream-")
    try:
        uris, totals = {}, {}
        for name, (commits, per_commit) in shapes.items():
            uris[name] = f"{scratch}/{name}"
            started = time.perf_counter()
            totals[name] = build_table(uris[name], commits, per_commit)
            took = time.perf_counter() - started
            print(f"{name}: {commits} commits x {per_commit:,} rows = {totals[name]:,} rows ({took:.1f} s)")
        spark = session()
        for name in shapes:  # warm-up: JIT, Python workers, imports, Delta's log replay code
            for source in SOURCES:
                run_query(spark, source, uris[name], scratch, {})
        runs: dict[tuple[Case, str], list[Run]] = {}
        for rep in range(args.repeat):
            for case in cases:
                for source in rotated(SOURCES, rep):
                    run = run_query(spark, source, uris[case.table], scratch, dict(case.options))
                    if run.rows != totals[case.table]:
                        raise AssertionError(
                            f"{source} read {run.rows} rows of {case}, the table has {totals[case.table]}"
                        )
                    runs.setdefault((case, source), []).append(run)
        pyspark_version = spark.version
        spark.stop()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    out = []
    for case in cases:
        total = totals[case.table]
        medians = {}
        for source in SOURCES:
            rs = runs[(case, source)]
            rate = Stat.of([total / r.wall for r in rs])
            medians[source] = (rate.median, Stat.of([r.cpu for r in rs]).median)
            options = ", ".join(f"{k}={v}" for k, v in case.options) or "defaults"
            out.append(
                [
                    f"{case.table} {case.label}",
                    options,
                    source,
                    rs[-1].batches,
                    Stat.of([r.wall for r in rs]).fmt(".2f", " s"),
                    rate.fmt(",.0f"),
                    Stat.of([r.jvm_cpu for r in rs]).fmt(".1f", " s"),
                    Stat.of([r.python_cpu for r in rs]).fmt(".1f", " s"),
                    Stat.of([r.cpu for r in rs]).fmt(".1f", " s"),
                ]
            )
        (ours_rate, ours_cpu), (their_rate, their_cpu) = medians["eventlog"], medians["delta"]
        out.append(
            [
                "",
                "",
                "**ours / Delta Spark**",
                "",
                "",
                f"**{ratio(ours_rate, their_rate):.2f}x**",
                "",
                "",
                f"{ratio(ours_cpu, their_cpu):.2f}x",
            ]
        )
    rows_note = ", ".join(f"{name} {totals[name]:,} rows in {shapes[name][0]} files" for name in shapes)
    print_table(
        f"availableNow into noop, Delta Spark {delta_version()} (Spark {pyspark_version}) and eventlog; "
        + rows_note,
        [
            "table, case",
            "options",
            "source",
            "batches",
            "query time",
            "rows/s",
            "JVM CPU",
            "Python CPU",
            "CPU",
        ],
        out,
    )
    print(machine_note())


if __name__ == "__main__":
    main()
