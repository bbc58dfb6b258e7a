"""Native Spark scans of an ``s3://`` table (``read_table`` through S3A) versus the ``eventlog``
Python data source and Spark's own ``spark.read.parquet`` of the same files through S3A.

Starts moto's standalone S3 server on a loopback port (``tests.support.s3server.MotoS3Server``)
and one local[2] SparkSession configured like the tests' (``tests/support/spark.py``), with
S3A's jars (``spark_adapter.s3a_jars()``) on ``spark.jars``. moto is a Python emulator on the
same 2 cores: its latency and CPU cost per request are not AWS's, so the ratios matter, and
the server's own CPU seconds are reported beside each engine's.

The table: ``bench_bulk.make_data`` rows (``id bigint, value double, name string, ts
timestamp, count int``; 2,000,000, ``--quick`` 200,000) in 8 appends (8 files), written by the
engine with ``storage_options={"endpoint_url", "key", "secret"}``. Sections:

* scan: every row, materialised with ``.write.format("noop")`` (the timing includes building
  the DataFrame: snapshot, planning):

  * ``native``:  ``read_table(spark, uri, storage_options=...)``: the options translated to
    S3A settings for that read (``spark_adapter.s3a``);
  * ``python``:  ``spark.read.format("eventlog").options(storage.<name>...).load(uri)``;
  * ``parquet``: ``spark.read.parquet(*the snapshot's files as s3a:// URIs)``, the S3A
    settings in the session's Hadoop configuration (``spark.hadoop.fs.s3a.*``), as a Spark
    user reading the files directly would.

* dv: the same table after ``Table.delete("id % 10 = 3")`` on a copy with deletion vectors
  (10% of every file's rows deleted): ``native`` (the JVM DV reader) and ``python``, against
  ``parquet`` reading the same files without the deletes.

Every read is checked (row count and column sums equal the engine's ``to_arrow()``). Engines
alternate which goes first from run to run; after one untimed warm-up of each, each is timed
``--repeat`` times: median [min-max] wall seconds, CPU seconds of the JVM, of the Python
workers, of the driver's Python process and of the S3 server. Ratios are throughput engine /
parquet (> 1 is faster).

Run from the repository root: ``.venv/bin/python bench/bench_native_s3.py [--quick] [--repeat N]``
"""

from __future__ import annotations

import functools
import gc
import json
import os
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repository root

from bench._common import (  # noqa: E402
    Stat,
    cpu_during,
    cpu_seconds,
    machine_note,
    parse_args,
    print_table,
    ratio,
    rotated,
    spark_session,
)
from bench._loops import spark_env  # noqa: E402
from bench.bench_bulk import make_data  # noqa: E402
from bench.bench_s3 import server_cpu  # noqa: E402
from tests.support.s3server import ACCESS_KEY, SECRET_KEY, MotoS3Server  # noqa: E402

spark_env()  # before any SparkSession

ENGINES = ("native", "python", "parquet")
SECTIONS = ("scan", "dv")
FILES = 8
DV = {"delta.enableDeletionVectors": "true"}


@dataclass(frozen=True)
class Sample:
    """One timed run: wall seconds, CPU seconds of the JVM, the workers, the driver, the server."""

    wall: float
    jvm: float
    workers: float
    driver: float
    server: float


def measure(fn: Callable[[], object], server: MotoS3Server) -> Sample:
    gc.collect()
    driver0, server0 = cpu_seconds(), server_cpu(server)
    wall, used = cpu_during(fn)
    return Sample(wall, used["jvm"], used["python"], cpu_seconds() - driver0, server_cpu(server) - server0)


def fingerprint(df: Any) -> tuple[Any, ...]:
    """Row count and column sums (exact: decimals and CRCs), equal for equal multisets of rows."""
    from pyspark.sql import functions as F

    row = df.agg(
        F.count(F.lit(1)),
        F.sum("id"),
        F.sum(F.col("value").cast("decimal(38,6)")),
        F.sum(F.crc32("name")),
        F.sum(F.unix_micros("ts").cast("decimal(38,0)")),
        F.sum("count"),
    ).collect()[0]
    return tuple(row)


def engine_fingerprint(uri: str, options: dict[str, str]) -> tuple[Any, ...]:
    """The same aggregates over the engine's own read (pyarrow)."""
    import zlib
    from decimal import Decimal

    import pyarrow.compute as pc

    from eventlog import Table

    with Table.open(uri, storage_options=options) as t:
        data = t.to_arrow()
    values = sum(Decimal(str(v)).quantize(Decimal("0.000001")) for v in data.column("value").to_pylist())
    crcs = sum(zlib.crc32(s.encode()) for s in data.column("name").to_pylist())
    micros = sum(data.column("ts").cast("int64").to_pylist())  # past int64: Python ints
    return (
        data.num_rows,
        pc.sum(data.column("id")).as_py(),
        values,
        crcs,
        micros,
        pc.sum(data.column("count")).as_py(),
    )


def write_table(uri: str, options: dict[str, str], rows: int, properties: dict[str, str] | None) -> None:
    from eventlog import Table

    data = make_data(rows)
    slots = uri.rsplit("/", 1)[0] + "/_slots"
    with Table.create(uri, data.schema, properties=properties, slots=slots, storage_options=options) as t:
        step = -(-rows // FILES)
        for start in range(0, rows, step):
            t.append(data.slice(start, step))
        if properties:
            t.delete("id % 10 = 3")


def file_uris(uri: str, options: dict[str, str]) -> list[str]:
    """The snapshot's data files as ``s3a://`` URIs."""
    from eventlog import Table
    from spark_adapter.native import file_uri

    with Table.open(uri, storage_options=options) as t:
        adds = t.snapshot().add_files
    return [file_uri("s3a://" + uri.split("://", 1)[1], f.path) for f in adds]


def noop(build: Callable[[], Any]) -> None:
    """Build the DataFrame and read every column of every row (timed together)."""
    build().write.format("noop").mode("overwrite").save()


def readers(spark: Any, uri: str, options: dict[str, str]) -> dict[str, Callable[[], Any]]:
    from spark_adapter import read_table

    spark_options = {f"storage.{k}": v for k, v in options.items()}
    files = file_uris(uri, options)
    return {
        "native": lambda: read_table(spark, uri, storage_options=options),
        "python": lambda: spark.read.format("eventlog").options(**spark_options).load(uri),
        "parquet": lambda: spark.read.parquet(*files),
    }


def main() -> int:
    args = parse_args(__doc__.split("\n\n")[0], default_repeat=5, quick_repeat=2)
    rows = 200_000 if args.quick else 2_000_000
    from spark_adapter import s3a_jars
    from spark_adapter.s3a import translate
    from tests.support.fixtures import s3_admin_client

    for name in [n for n in os.environ if n.startswith("AWS_")]:
        del os.environ[name]
    os.environ.update(AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY)
    print(machine_note())
    results: dict[tuple[str, str], list[Sample]] = {}
    with MotoS3Server() as server:
        endpoint = server.endpoint_url
        options = {"endpoint_url": endpoint, "key": ACCESS_KEY, "secret": SECRET_KEY}
        hadoop = {f"spark.hadoop.{k}": v for k, v in translate(options).items()}
        spark = spark_session(
            "bench-native-s3", driver_memory="1g", **{"spark.jars": ",".join(s3a_jars())}, **hadoop
        )
        bucket = f"bench-{uuid.uuid4().hex[:12]}"
        s3_admin_client(endpoint).create_bucket(Bucket=bucket)
        uris = {"scan": f"s3://{bucket}/plain", "dv": f"s3://{bucket}/dv"}
        write_table(uris["scan"], options, rows, None)
        write_table(uris["dv"], options, rows, DV)
        print(f"S3 server {endpoint} (pid {server.pid}); {rows:,} rows in {FILES} files per table")
        for section in SECTIONS:
            uri = uris[section]
            build = readers(spark, uri, options)
            want = engine_fingerprint(uri, options)
            plain = engine_fingerprint(uris["scan"], options)
            for engine in ENGINES:  # warm-up and check
                got = fingerprint(build[engine]())
                expected = plain if engine == "parquet" else want
                if got != expected:
                    raise SystemExit(f"{section}/{engine}: {got} != {expected}")
            native_files = build["native"]().inputFiles()
            assert all(f.startswith("s3a-") for f in native_files), native_files
            for rep in range(args.repeat):
                for engine in rotated(ENGINES, rep):
                    sample = measure(functools.partial(noop, build[engine]), server)
                    results.setdefault((section, engine), []).append(sample)
        spark.stop()

    for section in SECTIONS:
        table = []
        base = Stat.of([s.wall for s in results[(section, "parquet")]]).median
        for engine in ENGINES:
            samples = results[(section, engine)]
            wall = Stat.of([s.wall for s in samples])
            table.append(
                [
                    engine,
                    wall.fmt(".2f", " s"),
                    f"{ratio(base, wall.median):.2f}x",
                    Stat.of([s.jvm for s in samples]).fmt(".1f"),
                    Stat.of([s.workers for s in samples]).fmt(".1f"),
                    Stat.of([s.driver for s in samples]).fmt(".2f"),
                    Stat.of([s.server for s in samples]).fmt(".1f"),
                ]
            )
        what = (
            "full scan" if section == "scan" else "10% deleted by DVs (parquet: the same files, no deletes)"
        )
        print_table(
            f"{section}: {rows:,} rows, {what}; median [min-max] of {args.repeat}",
            [
                "engine",
                "wall",
                "throughput / parquet",
                "JVM CPU s",
                "workers CPU s",
                "driver CPU s",
                "S3 server CPU s",
            ],
            table,
        )
    print(json.dumps({f"{s}/{e}": [x.wall for x in v] for (s, e), v in results.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
