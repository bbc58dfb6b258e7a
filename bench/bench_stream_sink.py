"""Streaming sink: ``writeStream.format("eventlog")`` versus Spark's built-in Parquet sink,
and the file count and scan time of a table after many micro-batches, with and without
auto-compaction.

One local[2] SparkSession (as in the tests). Inputs are Parquet files read by Spark's file
source with ``maxFilesPerTrigger=1`` (one file per micro-batch) and
``trigger(availableNow=True)``, so every query processes the same batches:

* **batch latency**: ``--batches`` files (default 60; ``--quick``: 15) of ``--rows`` rows
  (default 5,000) with the columns ``id bigint, value double, name string, ts timestamp,
  count int``, streamed into a fresh eventlog table and into a fresh Parquet directory
  (each with a fresh checkpoint). A batch's duration is Spark's ``triggerExecution``
  (planning, the source, the tasks, the sink's commit, the offset and commit logs) from
  ``query.recentProgress``; a 3-batch query per sink runs first, unmeasured, and the first
  batch of each measured query is left out (warm-up). The sinks
  alternate which goes first; ``--repeat`` runs (default 3). Reported: median and p95 over
  all batches of all runs, and the median of each run as median [min-max]. Ratio: ours /
  Parquet (< 1 is better). Target: median <= 1.3x.
* **small files**: ``--many`` micro-batches (default 500; ``--quick``: 50) of 100 rows
  each into one eventlog table with ``autoCompact=false`` and into another with
  ``autoCompact=true`` (default threshold: 50 small files in a partition), then the live
  file count and the time of a full scan: ``Table.to_arrow()`` (median of 5) and
  ``spark.read.format("eventlog").load(uri)`` into the ``noop`` sink (median of 3). The
  streaming time of all batches and the median/p95 batch duration are reported too (the
  cost of compacting inside some commits).

Run from the repository root:
``.venv/bin/python bench/bench_stream_sink.py [--quick] [--repeat N] [--batches N] [--rows N] [--many N]``
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repository root
# Spark's Python workers find ``pyspark_eventlog`` (auto-registration) on PYTHONPATH.
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from bench._common import Stat, machine_note, print_table, ratio, rotated, spark_session  # noqa: E402
from eventlog import Table  # noqa: E402

SINKS = ("eventlog", "parquet")
DDL = "id bigint, value double, name string, ts timestamp, count int"
WAIT_SECONDS = 1800


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument(
        "--repeat", type=int, default=None, help="runs of the latency case (default 3; quick 1)"
    )
    parser.add_argument(
        "--batches", type=int, default=None, help="micro-batches per latency run (60; quick 15)"
    )
    parser.add_argument("--rows", type=int, default=5_000, help="rows per latency micro-batch (5000)")
    parser.add_argument(
        "--many", type=int, default=None, help="micro-batches of the small-file case (500; quick 50)"
    )
    args = parser.parse_args()
    args.repeat = args.repeat or (1 if args.quick else 3)
    args.batches = args.batches or (15 if args.quick else 60)
    args.many = args.many or (50 if args.quick else 500)
    return args


def sink_session(progress: int) -> Any:
    return spark_session(
        "bench-stream-sink",
        **{
            "spark.sql.shuffle.partitions": "2",
            "spark.sql.streaming.numRecentProgressUpdates": str(progress),
        },
    )


def write_inputs(directory: Path, files: int, rows: int) -> None:
    """``files`` Parquet files of ``rows`` rows, named (and timestamped) in order."""
    directory.mkdir(parents=True)
    now = time.time() - files
    for f in range(files):
        ids = pa.array(range(f * rows, (f + 1) * rows), pa.int64())
        table = pa.table(
            {
                "id": ids,
                "value": pa.compute.multiply(ids.cast(pa.float64()), 0.5),
                "name": pa.array([f"name-{i % 100000:05d}" for i in range(f * rows, (f + 1) * rows)]),
                "ts": pa.compute.add(ids, 1_700_000_000_000).cast(pa.timestamp("ms", tz="UTC")),
                "count": pa.compute.cast(pa.compute.bit_wise_and(ids, 1023), pa.int32()),
            }
        )
        path = directory / f"in-{f:05d}.parquet"
        pq.write_table(table, path)
        os.utime(path, (now + f, now + f))  # the file source takes files oldest first


def run_stream(
    spark: Any, inputs: Path, sink: str, target: str, checkpoint: str, **options: str
) -> list[float]:
    """One availableNow query; the triggerExecution (ms) of each of its micro-batches."""
    df = spark.readStream.schema(DDL).option("maxFilesPerTrigger", 1).parquet(str(inputs))
    query = (
        df.writeStream.format(sink)
        .option("checkpointLocation", checkpoint)
        .options(**options)
        .trigger(availableNow=True)
        .start(target)
    )
    try:
        if not query.awaitTermination(WAIT_SECONDS):
            raise RuntimeError(f"{sink} query did not finish in {WAIT_SECONDS} s")
    finally:
        query.stop()
    progress = [p for p in query.recentProgress if p["numInputRows"] > 0]
    return [float(p["durationMs"]["triggerExecution"]) for p in progress]


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def latency(spark: Any, work: Path, args: argparse.Namespace) -> bool:
    inputs = work / "latency-input"
    write_inputs(inputs, args.batches, args.rows)
    warm = work / "warm-up-input"
    write_inputs(warm, 3, args.rows)
    for sink in SINKS:  # the first queries of a session (JVM, Python workers) are slower
        run_stream(spark, warm, sink, str(work / f"warm-{sink}" / "out"), str(work / f"warm-{sink}" / "ck"))
    pooled: dict[str, list[float]] = {s: [] for s in SINKS}
    medians: dict[str, list[float]] = {s: [] for s in SINKS}
    for rep in range(args.repeat):
        for sink in rotated(SINKS, rep):
            run = work / f"latency-{sink}-{rep}"
            durations = run_stream(spark, inputs, sink, str(run / "out"), str(run / "checkpoint"))
            if len(durations) != args.batches:
                raise RuntimeError(f"{sink}: {len(durations)} batches, expected {args.batches}")
            kept = durations[1:]  # the first batch of a query warms up
            pooled[sink] += kept
            medians[sink].append(statistics.median(kept))
            shutil.rmtree(run)
    ours, theirs = (statistics.median(pooled[s]) for s in SINKS)
    rows = []
    for sink in SINKS:
        rows.append(
            [
                sink,
                f"{statistics.median(pooled[sink]):.0f}",
                f"{p95(pooled[sink]):.0f}",
                Stat.of(medians[sink]).fmt(".0f"),
                len(pooled[sink]),
            ]
        )
    rows.append(
        [
            "ratio ours/parquet",
            f"{ratio(ours, theirs):.2f}x",
            f"{ratio(p95(pooled['eventlog']), p95(pooled['parquet'])):.2f}x",
            "",
            "",
        ]
    )
    title = f"Micro-batch duration, ms ({args.batches} batches of {args.rows:,} rows, {args.repeat} runs)"
    print_table(
        title + "; ratio < 1x is better",
        ["sink", "median", "p95", "median per run", "batches"],
        rows,
    )
    met = ratio(ours, theirs) <= 1.3
    print(f"Target median <= 1.3x Parquet: {'MET' if met else 'MISSED'} ({ratio(ours, theirs):.2f}x)")
    return met


def scan_times(spark: Any, uri: str) -> tuple[Stat, Stat, int]:
    local: list[float] = []
    rows = 0
    for _ in range(5):
        start = time.perf_counter()
        with Table.open(uri) as t:
            rows = t.to_arrow().num_rows
        local.append(time.perf_counter() - start)
    remote: list[float] = []
    for _ in range(3):
        start = time.perf_counter()
        spark.read.format("eventlog").load(uri).write.format("noop").mode("overwrite").save()
        remote.append(time.perf_counter() - start)
    return Stat.of(local), Stat.of(remote), rows


def small_files(spark: Any, work: Path, args: argparse.Namespace) -> None:
    inputs = work / "many-input"
    write_inputs(inputs, args.many, 100)
    out = []
    for compact in ("false", "true"):
        uri = str(work / f"many-{compact}" / "table")
        start = time.perf_counter()
        durations = run_stream(
            spark, inputs, "eventlog", uri, str(work / f"many-{compact}" / "checkpoint"), autoCompact=compact
        )
        streamed = time.perf_counter() - start
        with Table.open(uri) as t:
            files = len(t.files())
            compactions = sum(1 for h in t.history() if h["operation"] == "OPTIMIZE")
        local, remote, rows = scan_times(spark, uri)
        if rows != args.many * 100:
            raise RuntimeError(f"autoCompact={compact}: {rows} rows, expected {args.many * 100}")
        out.append(
            [
                f"autoCompact={compact}",
                files,
                compactions,
                local.fmt(".3f", " s"),
                remote.fmt(".2f", " s"),
                f"{streamed:.0f} s",
                f"{statistics.median(durations):.0f} / {p95(durations):.0f}",
            ]
        )
    print_table(
        f"After {args.many} micro-batches of 100 rows (one file per batch)",
        [
            "table",
            "live files",
            "compactions",
            "Table.to_arrow()",
            "Spark full scan (noop)",
            "streaming time",
            "batch ms median / p95",
        ],
        out,
    )


def main() -> None:
    args = parse()
    print(f"# Streaming sink benchmark\n\n{machine_note()}")
    print(f"Command: {' '.join([os.path.basename(sys.executable), *sys.argv])}")
    spark = sink_session(max(args.batches, args.many) + 20)
    work = Path(tempfile.mkdtemp(prefix="bench-stream-sink-"))
    try:
        latency(spark, work, args)
        small_files(spark, work, args)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    with open("/proc/loadavg") as f:
        print(f"loadavg at the end: {' '.join(f.read().split()[:3])}")


if __name__ == "__main__":
    main()
