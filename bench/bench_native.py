"""Native Spark reads (``spark_adapter.read_table``) versus Spark's Parquet source and the
``eventlog`` Python data source, plus Spark DML before and after native target reads.

One local[2] SparkSession configured like the tests' (``tests/support/spark.py``). The rows are
bench_spark's ``COLUMNS`` (``id bigint, value double, name string, ts timestamp, count int``)
from ``spark.range`` in 2 partitions, written by ``df.write.format("eventlog")``:

* scan:     a 5,000,000-row table (``--quick``: 300,000), read in full by ``native``
            (``read_table(spark, uri)``), ``parquet`` (``spark.read.parquet(*the snapshot's data
            files)``) and ``python`` (``spark.read.format("eventlog").load(uri)``). Every read is
            materialised with ``.write.format("noop")``; the timing includes building the
            DataFrame (snapshot, planning). Target: native >= 0.9x Parquet.
* filter:   the same rows plus ``p = concat('v', id % 10)``, partitioned by ``p``; the rows of
            ``p = 'v3'`` read by ``native-where`` (``read_table(..., where="p = 'v3'")``),
            ``native-df`` (``read_table(...).where("p = 'v3'")``), ``parquet`` (the table directory,
            Hive layout, ``.where("p = 'v3'")``) and ``python`` (``filterPushdown=true``). The files
            each plans (``df.inputFiles()``) must be exactly the partition's live files in the
            snapshot: PASS/FAIL.
* dv:       the scan's rows in a table with ``delta.enableDeletionVectors = true`` and 10% of
            the rows of every file deleted by ``Table.open(uri).delete("id % 10 = 3")`` (deletion
            vectors); ``native`` against ``parquet`` reading the same files *without* the deletes,
            and ``python``. Target: native >= 0.8x Parquet.
* dml:      ``EventlogTable.forPath`` DELETE, UPDATE and MERGE touching ~1% of a 1,000,000-row
            table (``--quick``: 50,000), without deletion vectors (``dml``: touched files are
            rewritten) and with them (``dml-dv``: old rows are DV-deleted), each on a
            fresh ``shutil.copytree`` of one prepared table, with the session conf
            ``spark.eventlog.native.enabled`` = ``false`` ("before": the target is read by Python
            tasks) and ``true`` ("after": native reads). "after" runs only when the conf exists
            in ``spark_adapter``.

Every result is checked (row counts and column sums against the other engines, the live
rows after each DML). Engines alternate which goes first from run to run; after untimed
warm-ups, each measurement is repeated ``--repeat`` times and reported as median [min-max],
with CPU seconds of the JVM, of the Python workers (bench_spark's ``/proc`` reading) and of
the driver's Python process. Ratios are throughput engine / Parquet (> 1 is better).

Run from the repository root: ``.venv/bin/python bench/bench_native.py [--quick] [--repeat N]``
"""

from __future__ import annotations

import functools
import gc
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repository root

# Importing bench_spark also puts the repository on Spark workers' PYTHONPATH and sets
# SPARK_LOCAL_IP / PYSPARK_PYTHON, as its own runs need.
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
    verdict,
)
from bench.bench_spark import COLUMNS  # noqa: E402

NATIVE_CONF = "spark.eventlog.native.enabled"
SCAN_ENGINES = ("native", "parquet", "python")
FILTER_ENGINES = ("native-where", "native-df", "parquet", "python")
DML_MODES = ("before", "after")
DML_OPS = ("delete", "update", "merge")
DML_TABLES = ("dml", "dml-dv")  # without and with deletion vectors
PARTITION = "v3"
TARGET_SCAN = 0.9
TARGET_DV = 0.8


@dataclass(frozen=True)
class Sample:
    """One timed run: wall seconds and CPU seconds of the JVM, the workers and the driver."""

    wall: float
    jvm: float
    workers: float
    driver: float


def measure(fn: Callable[[], object]) -> Sample:
    gc.collect()
    driver0 = cpu_seconds()
    wall, used = cpu_during(fn)
    return Sample(wall, used["jvm"], used["python"], cpu_seconds() - driver0)


@dataclass
class Results:
    """Every timed run, keyed by (section, engine or DML op/mode)."""

    samples: dict[tuple[str, str], list[Sample]] = field(default_factory=dict)

    def add(self, section: str, engine: str, sample: Sample) -> None:
        self.samples.setdefault((section, engine), []).append(sample)

    def walls(self, section: str, engine: str) -> list[float]:
        return [s.wall for s in self.samples.get((section, engine), [])]

    def has(self, section: str, engine: str) -> bool:
        return (section, engine) in self.samples


def session() -> Any:
    """A local[2] session with the tests' configuration (``tests/support/spark.py``)."""
    pushdown = {"spark.sql.python.filterPushdown.enabled": "true"}
    return spark_session("bench-native", driver_memory="1g", **pushdown)


def git(*args: str) -> str:
    """Read-only git in the repository ("unknown" when git fails)."""
    try:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True)
        return done.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def code_note() -> str:
    """HEAD, whether spark_adapter/ differs from it, and native_dv.py's last commit."""
    dirty = git("status", "--porcelain", "--", "spark_adapter").split()[1::2]
    edits = f" (uncommitted edits in {', '.join(dirty)})" if dirty else ""
    return (
        f"HEAD {git('rev-parse', '--short', 'HEAD')}{edits}; "
        f"native_dv.py last changed in {git('log', '-1', '--format=%h', '--', 'spark_adapter/native_dv.py')}"
    )


def native_conf_supported() -> bool:
    return any(NATIVE_CONF in p.read_text() for p in (ROOT / "spark_adapter").rglob("*.py"))


def noop(df: Any) -> None:
    df.write.format("noop").mode("overwrite").save()


def materialise(build: Callable[[], Any]) -> None:
    """Build the DataFrame and read every column of every row (timed together)."""
    noop(build())


def basename(uri: str) -> str:
    return os.path.basename(unquote(urlparse(uri).path))


def data_files(uri: str, partition: str | None = None) -> list[str]:
    """Hadoop URIs of the latest snapshot's live files (of one ``p`` partition if given)."""
    from eventlog.table import Table
    from spark_adapter.native import file_uri

    with Table.open(uri) as table:
        adds = table.snapshot().add_files
    root = "file:" + uri
    return [
        file_uri(root, f.path) for f in adds if partition is None or f.partition_values.get("p") == partition
    ]


def fingerprint(df: Any) -> tuple[Any, ...]:
    """Row count and per-column aggregates: equal for equal multisets of rows (in practice)."""
    from pyspark.sql import functions as F

    row = df.agg(
        F.count(F.lit(1)),
        F.sum("id"),
        F.sum(F.col("value").cast("decimal(38,2)")),  # exact: no dependence on row order
        F.count("name"),
        F.sum(F.crc32("name")),
        F.sum(F.unix_micros("ts").cast("decimal(38,0)")),
        F.sum("count"),
    ).collect()[0]
    return tuple(row)


# --------------------------------------------------------------------------- tables


def write_tables(spark: Any, work: Path, rows: int, dml_rows: int) -> dict[str, str]:
    """The tables (plain, partitioned, DV, the DML masters) and tiny DML warm-up tables."""
    from pyspark.sql.pandas.types import to_arrow_schema

    from eventlog.table import Table

    names = ("plain", "parted", "dv", *DML_TABLES, *(f"{t}-warm" for t in DML_TABLES))
    paths = {name: str(work / name) for name in names}
    data = spark.range(0, rows, numPartitions=2).selectExpr(*COLUMNS)
    data.write.format("eventlog").mode("append").save(paths["plain"])
    parted = spark.range(0, rows, numPartitions=2).selectExpr(
        *COLUMNS, "concat('v', cast(id % 10 AS string)) AS p"
    )
    parted.write.format("eventlog").option("partitionBy", "p").mode("append").save(paths["parted"])
    schema = to_arrow_schema(data.schema, timezone="UTC")
    Table.create(paths["dv"], schema, properties={"delta.enableDeletionVectors": "true"}).close()
    data.write.format("eventlog").mode("append").save(paths["dv"])
    with Table.open(paths["dv"]) as table:
        table.delete("id % 10 = 3")
        dvs = sum(f.deletion_vector is not None for f in table.snapshot().add_files)
        total = len(table.snapshot().add_files)
    if dvs != total:
        raise SystemExit(f"ERROR: {dvs} of {total} files of the DV table have a deletion vector")
    for name in paths:
        if name.startswith("dml"):
            if "-dv" in name:
                Table.create(paths[name], schema, properties={"delta.enableDeletionVectors": "true"}).close()
            n = 1000 if name.endswith("-warm") else dml_rows
            rows_n = spark.range(0, n, numPartitions=2).selectExpr(*COLUMNS)
            rows_n.write.format("eventlog").mode("append").save(paths[name])
    return paths


def describe(uri: str) -> str:
    from eventlog.table import Table

    with Table.open(uri) as table:
        adds = table.snapshot().add_files
    size = sum(f.size for f in adds)
    with_dv = sum(f.deletion_vector is not None for f in adds)
    return f"{len(adds)} files, {size / 1e6:.0f} MB" + (
        f", {with_dv} with a deletion vector" if with_dv else ""
    )


# --------------------------------------------------------------------------- reads


def scan_readers(spark: Any, uri: str) -> dict[str, Callable[[], Any]]:
    """Full-table DataFrame builders per engine (built inside the timing)."""
    from spark_adapter import read_table

    files = data_files(uri)
    return {
        "native": lambda: read_table(spark, uri),
        "parquet": lambda: spark.read.parquet(*files),
        "python": lambda: spark.read.format("eventlog").load(uri),
    }


def filter_readers(spark: Any, uri: str) -> dict[str, Callable[[], Any]]:
    from spark_adapter import read_table

    cond = f"p = '{PARTITION}'"
    return {
        "native-where": lambda: read_table(spark, uri, where=cond),
        "native-df": lambda: read_table(spark, uri).where(cond),
        "parquet": lambda: spark.read.parquet(uri).where(cond),
        "python": lambda: (
            spark.read.format("eventlog").option("filterPushdown", "true").load(uri).where(cond)
        ),
    }


def check_reads(spark: Any, paths: dict[str, str], rows: int) -> list[str]:
    """Untimed correctness checks of every read; returns problems (empty: all PASS)."""
    problems: list[str] = []
    scan = {e: fingerprint(f()) for e, f in scan_readers(spark, paths["plain"]).items()}
    print(f"check scan: {scan['native'][0]:,} rows")
    for e, fp in scan.items():
        if fp != scan["parquet"] or fp[0] != rows:
            problems.append(f"scan: {e} read {fp}, parquet {scan['parquet']} ({rows} rows expected)")
    dv_parquet = spark.read.parquet(*data_files(paths["dv"])).where("id % 10 != 3")
    want = fingerprint(dv_parquet)
    for e, f in scan_readers(spark, paths["dv"]).items():
        if e == "parquet":
            continue
        got = fingerprint(f())
        print(f"check dv {e}: {got[0]:,} rows (expected {want[0]:,})")
        if got != want:
            problems.append(f"dv: {e} read {got}, expected {want}")
    print(check_filter(spark, paths["parted"], rows, problems))
    return problems


def check_filter(spark: Any, uri: str, rows: int, problems: list[str]) -> str:
    """Files planned by each filtered read against the partition's live files; rows too."""
    expected = sorted(basename(p) for p in data_files(uri, PARTITION))
    lines = [f"check filter: partition p = '{PARTITION}' has {len(expected)} live files"]
    reference: tuple[Any, ...] | None = None
    for e, f in filter_readers(spark, uri).items():
        df = f()
        fp = fingerprint(df)
        reference = reference or fp
        if fp != reference or fp[0] != rows // 10:
            problems.append(f"filter: {e} read {fp}, expected {reference} ({rows // 10} rows)")
        if e == "python":
            continue  # a Python data source lists no input files
        planned = sorted(basename(p) for p in df.inputFiles())
        if e == "parquet":
            # inputFiles() lists the whole relation; Spark prunes partitions when it executes.
            lines.append(f"  {e}: inputFiles() lists {len(planned)} (the relation; pruned at execution)")
            continue
        ok = planned == expected
        if not ok:
            problems.append(f"filter: {e} planned {len(planned)} files, the partition has {len(expected)}")
        lines.append(
            f"  {e}: {len(planned)} files planned, {len(expected)} expected: {'PASS' if ok else 'FAIL'}"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------- DML


def dml_runner(
    spark: Any, op: str, path: str, rows: int
) -> tuple[Callable[[], object], Callable[[], str | None]]:
    """(the timed operation, a check returning a problem or None) on the table at ``path``."""
    import pyarrow.compute as pc

    from eventlog.table import Table
    from spark_adapter import EventlogTable

    t = EventlogTable.forPath(spark, path)
    touched = len(range(7, rows, 100))
    if op == "delete":
        run: Callable[[], object] = lambda: t.delete("id % 100 = 7")  # noqa: E731
        want_rows, want_changed = rows - touched, 0
    elif op == "update":
        run = lambda: t.update("id % 100 = 7", set={"value": "value + 1"})  # noqa: E731
        want_rows, want_changed = rows, touched
    else:
        # rows / 100 source rows: half match existing ids (updated), half are new (inserted).
        source = spark.range(0, 2 * rows, 200, numPartitions=2).selectExpr(
            *[c if not c.endswith("AS value") else "id * 0.5d + 1 AS value" for c in COLUMNS]
        )
        run = lambda: (  # noqa: E731
            t.alias("t")
            .merge(source.alias("s"), "t.id = s.id")
            .whenMatchedUpdateAll()
            .whenNotMatchedInsertAll()
            .execute()
        )
        matched = len(range(0, rows, 200))
        want_rows, want_changed = rows + len(range(0, 2 * rows, 200)) - matched, matched

    def check() -> str | None:
        got = Table.open(path).to_arrow(columns=["id", "value"])
        changed = pc.sum(pc.not_equal(got["value"], pc.multiply(pc.cast(got["id"], "float64"), 0.5))).as_py()
        if op == "merge":
            changed -= len(range(rows, 2 * rows, 200))  # inserted rows carry id * 0.5 + 1 too
        if got.num_rows != want_rows or (changed or 0) != want_changed:
            return f"{op}: {got.num_rows} rows / {changed} changed, expected {want_rows} / {want_changed}"
        return None

    return run, check


def run_dml(
    spark: Any, res: Results, table: str, master: str, work: Path, rows: int, modes: Sequence[str], rep: int
) -> None:
    for op in DML_OPS:
        for mode in rotated(modes, rep):
            copy = str(work / f"{table}-{op}-{mode}-{rep}")
            # The Delta table proper; our embedded slot store (_eventlog/) is keyed by path.
            shutil.copytree(master, copy, ignore=shutil.ignore_patterns("_eventlog"))
            spark.conf.set(NATIVE_CONF, "true" if mode == "after" else "false")
            run, check = dml_runner(spark, op, copy, rows)
            os.sync()
            res.add(table, f"{op}/{mode}", measure(run))
            problem = check()
            if problem:
                raise SystemExit(f"ERROR: {table} {mode}: {problem}")
            shutil.rmtree(copy)
    spark.conf.unset(NATIVE_CONF)


# --------------------------------------------------------------------------- main


def main() -> int:
    args = parse_args(__doc__ or "", default_repeat=3, quick_repeat=1)
    rows = 300_000 if args.quick else 5_000_000
    dml_rows = 50_000 if args.quick else 1_000_000
    modes = DML_MODES if native_conf_supported() else DML_MODES[:1]
    started = time.perf_counter()
    print("# Native Spark reads: read_table vs parquet vs format('eventlog')\n")
    print(f"{machine_note()}\n{code_note()}")
    spark = session()
    print(f"pyspark {spark.version}; scans {rows:,} rows; DML {dml_rows:,} rows; repeat {args.repeat}")
    if len(modes) == 1:
        print(f"NOTE: {NATIVE_CONF} is not in spark_adapter/: DML 'after' (native target reads) not measured")
    work = Path(tempfile.mkdtemp(prefix="bench-native-"))
    res = Results()
    try:
        t0 = time.perf_counter()
        paths = write_tables(spark, work, rows, dml_rows)
        print(f"tables written in {time.perf_counter() - t0:.0f} s")
        for name in ("plain", "parted", "dv", *DML_TABLES):
            print(f"  {name}: {describe(paths[name])}")
        # Warm-up and checks (untimed): JVM code paths, Python workers, the data source lookup.
        problems = check_reads(spark, paths, rows)
        for mode in modes:
            spark.conf.set(NATIVE_CONF, "true" if mode == "after" else "false")
            for table in DML_TABLES:
                for op in DML_OPS:
                    copy = str(work / f"warm-{table}-{op}-{mode}")
                    shutil.copytree(paths[f"{table}-warm"], copy, ignore=shutil.ignore_patterns("_eventlog"))
                    run, check = dml_runner(spark, op, copy, 1000)
                    run()
                    problem = check()
                    if problem:
                        problems.append(f"{table} warm-up {mode}: {problem}")
        spark.conf.unset(NATIVE_CONF)
        for problem in problems:
            print(f"FAIL: {problem}")
        sections = (
            ("scan", scan_readers(spark, paths["plain"]), SCAN_ENGINES),
            ("filter", filter_readers(spark, paths["parted"]), FILTER_ENGINES),
            ("dv", scan_readers(spark, paths["dv"]), SCAN_ENGINES),
        )
        for rep in range(args.repeat):
            for section, readers, engines in sections:
                for engine in rotated(engines, rep):
                    os.sync()
                    res.add(section, engine, measure(functools.partial(materialise, readers[engine])))
            for table in rotated(DML_TABLES, rep):
                run_dml(spark, res, table, paths[table], work, dml_rows, modes, rep)
            print(f"  run {rep + 1}: " + run_line(res), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        spark.stop()
    report(res, rows, dml_rows, modes, problems)
    print(f"\n{machine_note()}\ntotal {time.perf_counter() - started:.0f} s")
    return 1 if problems else 0


def run_line(res: Results) -> str:
    last = {key: samples[-1].wall for key, samples in res.samples.items()}
    return "; ".join(f"{s} {e} {w:.2f}s" for (s, e), w in last.items())


def report(res: Results, rows: int, dml_rows: int, modes: Sequence[str], problems: Sequence[str]) -> None:
    def mrows(section: str, engine: str, n: int) -> Stat:
        return Stat.of([n / t / 1e6 for t in res.walls(section, engine)])

    def paired(section: str, engine: str) -> Stat:
        """Per-run ratios parquet time / engine time (the two ran side by side in each run)."""
        return Stat.of(
            [
                ratio(p, e)
                for p, e in zip(res.walls(section, "parquet"), res.walls(section, engine), strict=True)
            ]
        )

    def ratio_row(section: str, name: str, n: int, engines: Sequence[str], target: float | None) -> list[str]:
        stats = {e: mrows(section, e, n) for e in engines}
        cells = [name, *(stats[e].fmt(".2f") for e in engines)]
        for e in engines:
            if e == "parquet":
                continue
            r = ratio(stats[e].median, stats["parquet"].median)
            cells.append(f"{r:.2f}x ({paired(section, e).fmt('.2f', 'x')})")
        if target is not None:
            r = ratio(stats[engines[0]].median, stats["parquet"].median)
            cells += [f">= {target}x", verdict(r >= target)]
        return cells

    others = [e for e in SCAN_ENGINES if e != "parquet"]
    print_table(
        "Full scans (M rows/s read from the files, median [min-max]; ratios engine / parquet from the "
        "medians, and (median [min-max] of per-run ratios); > 1 is better)",
        ["scan", *SCAN_ENGINES, *(f"{e} / parquet" for e in others), "target (native)", "verdict"],
        [
            ratio_row("scan", f"full scan, {rows:,} rows", rows, SCAN_ENGINES, TARGET_SCAN),
            ratio_row("dv", f"DV table, {rows:,} rows, 10% deleted", rows, SCAN_ENGINES, TARGET_DV),
        ],
    )
    part_rows = rows // 10
    f_others = [e for e in FILTER_ENGINES if e != "parquet"]
    print_table(
        f"Partition filter p = '{PARTITION}' ({part_rows:,} of {rows:,} rows; M rows/s of the partition)",
        ["scan", *FILTER_ENGINES, *(f"{e} / parquet" for e in f_others)],
        [ratio_row("filter", "one partition of 10", part_rows, FILTER_ENGINES, None)],
    )
    dml_rows_out = []
    for table, op in ((t, o) for t in DML_TABLES for o in DML_OPS):
        stats = {m: Stat.of(res.walls(table, f"{op}/{m}")) for m in modes}
        cells = [f"{op} ({'DVs' if table == 'dml-dv' else 'rewrite'})", *(stats[m].fmt(".2f") for m in modes)]
        if "after" in stats:
            cells.append(f"{ratio(stats['before'].median, stats['after'].median):.2f}x")
        dml_rows_out.append(cells)
    print_table(
        f"Spark DML on {dml_rows:,} rows, ~1% touched (wall s, median [min-max]; speed-up before / after)",
        ["operation", *(f"{m} ({NATIVE_CONF}={'true' if m == 'after' else 'false'})" for m in modes),
         *(["speed-up"] if "after" in modes else [])],
        dml_rows_out,
    )  # fmt: skip
    cpu_rows = []
    for (section, engine), samples in res.samples.items():
        cpu_rows.append(
            [section, engine, f"{statistics.median(s.wall for s in samples):.2f}"]
            + [
                f"{statistics.median(getattr(s, k) for s in samples):.2f}"
                for k in ("jvm", "workers", "driver")
            ]
        )
    print_table(
        "Where the time goes: CPU seconds per run (medians): JVM threads, Python workers, driver process",
        ["section", "engine", "wall s", "JVM CPU s", "Python workers CPU s", "driver CPU s"],
        cpu_rows,
    )
    print("checks: " + ("all PASS" if not problems else f"{len(problems)} FAIL (listed above)"))


if __name__ == "__main__":
    sys.exit(main())
