"""Streaming source throughput: ``readStream.format("eventlog")`` versus Spark's file source.

One table of 200 commits (``--quick``: 20), each a blind append of one Parquet file of
5,000 rows (``--quick``: 1,000) with the columns ``id bigint, value double, name string,
ts timestamp, count int``, written by ``Table.append``. Both sources read the *same*
Parquet files: Spark's file source is pointed at the table directory (it skips
``_delta_log`` and ``_eventlog``, whose names start with ``_``).

Each run is one ``trigger(availableNow=True)`` query into the ``noop`` sink with a fresh
checkpoint, timed from ``start()`` to its termination (query planning, every micro-batch,
the offset and commit logs); rows/s = rows read / that time. Sources:

* ``eventlog snapshot``: no starting version, so the whole table is the first batch
  (the snapshot, as a new stream reads it);
* ``eventlog commits``: ``startingVersion=1``, the 200 commits read from the log one by one
  (offsets, change selection and admission over every commit);
* ``parquet files``: ``spark.readStream.schema(...).parquet(table dir)``;
* ``pyfloor``: a reference Python streaming source that does the least any can (offsets
  count the table directory's Parquet files, tasks only ``pq.read_table`` them): the floor
  of pyspark's Python streaming source API on this machine.

Two admissions: ``maxFilesPerTrigger=1000`` (one batch) and ``maxFilesPerTrigger=20``
(10 batches for 200 commits), the same option for every source. Sources alternate which
goes first; each case runs ``--repeat`` times (default 5) and is reported as median
[min-max]. The ratio is rows/s ours / file source (> 1 is better); the rows each query
read are checked against the table.

Run from the repository root: ``.venv/bin/python bench/bench_stream_source.py [--quick] [--repeat N]``
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repository root

import pyarrow as pa  # noqa: E402

from bench._common import Stat, machine_note, parse_args, print_table, ratio, rotated, spark_session  # noqa: E402
from bench._loops import available_now, spark_env  # noqa: E402
from eventlog import Table  # noqa: E402

spark_env()  # before any SparkSession

SOURCES = ("eventlog snapshot", "eventlog commits", "parquet files", "pyfloor")
DDL = "id bigint, value double, name string, ts timestamp, count int"
WAIT_SECONDS = 600


def build_table(uri: str, commits: int, rows_per_commit: int) -> int:
    """The benchmark table: ``commits`` appends of one file each; returns the row count."""
    table = Table.create(
        uri,
        pa.schema(
            [
                ("id", pa.int64()),
                ("value", pa.float64()),
                ("name", pa.string()),
                ("ts", pa.timestamp("us", tz="UTC")),
                ("count", pa.int32()),
            ]
        ),
    )
    with table:
        for c in range(commits):
            ids = pa.array(range(c * rows_per_commit, (c + 1) * rows_per_commit), pa.int64())
            table.append(
                pa.table(
                    {
                        "id": ids,
                        "value": pa.array([i * 0.5 for i in ids.to_pylist()], pa.float64()),
                        "name": pa.array([f"name-{i % 100000:05d}" for i in ids.to_pylist()]),
                        "ts": pa.array(
                            [1_700_000_000_000_000 + i * 1000 for i in ids.to_pylist()],
                            pa.timestamp("us", tz="UTC"),
                        ),
                        "count": pa.array([i % 1000 for i in ids.to_pylist()], pa.int32()),
                    }
                )
            )
    return commits * rows_per_commit


def floor_source() -> type:
    """``format("pystreamfloor")``: the least a Python streaming source can do, for reference.

    Offsets count the sorted Parquet files under the path; ``partitions`` splits a batch's
    files in two (one task per core); ``read`` is ``pq.read_table`` cast to Spark's schema.
    Defined in a function so the classes are pickled by value into Spark's workers.
    """
    import pyarrow.parquet as pq
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxFiles, SupportsTriggerAvailableNow

    class FloorReader(DataSourceStreamReader, SupportsTriggerAvailableNow):  # type: ignore[misc]
        def __init__(self, path: str, schema: Any, max_files: int) -> None:
            self.path, self.schema, self.max_files = path, schema, max_files
            self.target: int | None = None

        def files(self) -> list[str]:
            return sorted(str(p) for p in Path(self.path).glob("*.parquet"))

        def initialOffset(self) -> dict[str, int]:
            return {"n": 0}

        def getDefaultReadLimit(self) -> ReadLimit:
            return ReadMaxFiles(self.max_files)

        def prepareForTriggerAvailableNow(self) -> None:
            self.target = len(self.files())

        def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
            n = len(self.files()) if self.target is None else self.target
            if isinstance(limit, ReadMaxFiles):
                n = min(n, start["n"] + limit.max_files)
            return {"n": n}

        def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[Any]:
            files = self.files()[start["n"] : end["n"]]
            half = (len(files) + 1) // 2
            return [InputPartition(group) for group in (files[:half], files[half:]) if group]

        def read(self, partition: Any) -> Any:
            target = to_arrow_schema(self.schema, timezone="UTC")
            for f in partition.value:
                yield from pq.read_table(f).cast(target).to_batches(max_chunksize=64 * 1024)

    class Floor(DataSource):  # type: ignore[misc]
        @classmethod
        def name(cls) -> str:
            return "pystreamfloor"

        def schema(self) -> str:
            return DDL

        def streamReader(self, schema: Any) -> FloorReader:
            return FloorReader(
                self.options["path"], schema, int(self.options.get("maxFilesPerTrigger", "1000"))
            )

    return Floor


def session() -> Any:
    return spark_session("bench-stream-source")


def run_query(spark: Any, source: str, uri: str, scratch: str, max_files: int) -> tuple[float, int, int]:
    """(seconds, rows read, micro-batches) of one availableNow query of ``source``."""
    limit = {"maxFilesPerTrigger": str(max_files)}
    if source == "parquet files":
        df = spark.readStream.schema(DDL).options(**limit).parquet(uri)
    elif source == "pyfloor":
        df = spark.readStream.format("pystreamfloor").options(**limit).load(uri)
    elif source == "eventlog commits":
        df = spark.readStream.format("eventlog").options(startingVersion="1", **limit).load(uri)
    else:
        df = spark.readStream.format("eventlog").options(**limit).load(uri)
    checkpoint = f"{scratch}/cp-{uuid.uuid4().hex}"
    start = time.perf_counter()
    with available_now(df, checkpoint, source, WAIT_SECONDS) as query:
        seconds = time.perf_counter() - start
    progress = [p for p in query.recentProgress if p["numInputRows"] or p["sources"]]
    rows = sum(p["numInputRows"] for p in progress)
    batches = len({p["batchId"] for p in progress if p["numInputRows"]})
    shutil.rmtree(checkpoint, ignore_errors=True)
    return seconds, rows, batches


def main() -> None:
    args = parse_args(__doc__ or "", default_repeat=5, quick_repeat=1)
    commits, per_commit = (20, 1_000) if args.quick else (200, 5_000)
    scratch = tempfile.mkdtemp(prefix="bench-stream-source-")
    try:
        uri = f"{scratch}/table"
        started = time.perf_counter()
        total = build_table(uri, commits, per_commit)
        built = time.perf_counter() - started
        print(f"table: {commits} commits x {per_commit} rows = {total} rows ({built:.1f} s)")
        spark = session()
        spark.dataSource.register(floor_source())
        for source in SOURCES:  # warm-up: workers, JIT, imports
            run_query(spark, source, uri, scratch, 1000)
        limits = (1000, 20)
        seconds: dict[tuple[str, int], list[float]] = {}
        batches: dict[tuple[str, int], int] = {}
        for rep in range(args.repeat):
            for max_files in limits:
                for source in rotated(SOURCES, rep):
                    took, rows, n = run_query(spark, source, uri, scratch, max_files)
                    if rows != total:
                        raise AssertionError(f"{source} read {rows} rows, the table has {total}")
                    seconds.setdefault((source, max_files), []).append(took)
                    batches[(source, max_files)] = n
        spark.stop()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    out = []
    for max_files in limits:
        peer = Stat.of(seconds[("parquet files", max_files)]).median
        for source in SOURCES:
            stat = Stat.of(seconds[(source, max_files)])
            rate = Stat.of([total / s for s in seconds[(source, max_files)]])
            out.append(
                [
                    source,
                    max_files,
                    batches[(source, max_files)],
                    stat.fmt(".2f", " s"),
                    rate.fmt(",.0f"),
                    f"{ratio(peer, stat.median):.2f}x",
                ]
            )
    print_table(
        f"availableNow over {commits} commits ({total:,} rows) into noop; "
        "rows/s ours / file source, > 1 is better",
        ["source", "maxFilesPerTrigger", "batches", "query time", "rows/s", "vs parquet files"],
        out,
    )
    print(machine_note())


if __name__ == "__main__":
    main()
