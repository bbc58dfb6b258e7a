"""Native Spark reads of a table with deletion vectors, against Spark's plain Parquet scan.

A table of ``--rows`` rows (default 5,000,000; ``--quick``: 500,000) with the columns
``id bigint, value double, name string, ts timestamp, count int`` (``count`` random in
[0, 1000)) is written by our library in ``--files`` appends (default 10; one file each),
with ``delta.enableDeletionVectors = true``, then 10% of every file's rows are deleted by
deletion vectors, in two patterns (one table each):

* ``regular``: ``id % 10 = 3``
* ``random``:  ``count % 10 = 0`` (``count`` is random, so the deleted rows are scattered)

Every design reads all columns of the live rows into ``write.format("noop")``; the time
covers building the DataFrame (for ``read_table``: opening the table, decoding its DVs)
and the job. Designs, interleaved (the first one rotates from run to run):

* ``parquet``: ``spark.read.parquet`` of the same files, deleted rows included: the target's
  reference (throughput of the DV read >= 0.8x of it).
* ``read_table``: what ships: :func:`spark_adapter.read_table` (``native_dv``: DV bits in an
  ``UnsafeArrayData`` literal, a ``CASE`` tree on ``_metadata.file_size``).
* ``boxed-array``: the previous design: the same bits as an ``F.lit``-built
  ``array<bigint>`` (constant-folded to boxed longs), ``element_at`` and ``bit_get``.
* ``tmp-row-index``: as ``read_table`` but the row index read as a data column named
  ``_tmp_metadata_row_index`` (Spark's Parquet reader fills a column of that name with the
  row index), so no ``_metadata`` struct is built per row (needs a change in native.py).
* ``java-udf``: a Java ``UDF2<Long, Long, Boolean>`` over a ``long[]`` (compiled here with
  ``javac`` against pyspark's jars and added with ``ADD JAR``; skipped without javac).

Wall time and CPU time (this process plus the Spark JVM's, all threads) are the median
[min-max] of ``--repeat`` runs (default 5). Every design's row count is checked.

Run: ``.venv/bin/python bench/bench_native_dv.py [--quick] [--repeat N] [--rows N] [--files N]``
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repository root
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

from bench._common import Stat, cpu_seconds, machine_note, print_table, ratio, rotated, spark_session, verdict  # noqa: E402

DESIGNS = ("parquet", "read_table", "boxed-array", "tmp-row-index", "java-udf")
PATTERNS = (("regular", "id % 10 = 3"), ("random", "count % 10 = 0"))
TARGET = 0.8  # DV read throughput / plain Parquet scan throughput
TMP_ROW_INDEX = "_tmp_metadata_row_index"
SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("value", pa.float64()),
        ("name", pa.string()),
        ("ts", pa.timestamp("us", tz="UTC")),
        ("count", pa.int32()),
    ]
)
JAVA_UDF = """
package benchdv;

public final class KeepRow implements org.apache.spark.sql.api.java.UDF2<Long, Long, Boolean> {
  private final long[] words;
  private final long[] sizes;
  private final int[] starts;

  public KeepRow(byte[] littleEndianWords, long[] sizes, int[] starts) {
    java.nio.LongBuffer b = java.nio.ByteBuffer.wrap(littleEndianWords)
        .order(java.nio.ByteOrder.LITTLE_ENDIAN).asLongBuffer();
    this.words = new long[b.remaining()];
    b.get(this.words);
    this.sizes = sizes;
    this.starts = starts;
  }

  @Override
  public Boolean call(Long fileSize, Long rowIndex) {
    int i = java.util.Arrays.binarySearch(sizes, fileSize);
    if (i < 0) throw new IllegalStateException("file of " + fileSize + " bytes has no deletion vector");
    long r = rowIndex;
    return ((words[starts[i] + (int) (r >>> 6)] >>> r) & 1L) == 0L;
  }
}
"""


def build_table(uri: str, rows: int, files: int, predicate: str) -> int:
    """The DV table; returns its live row count."""
    from eventlog import Table

    table = Table.create(uri, SCHEMA, properties={"delta.enableDeletionVectors": "true"})
    rng = np.random.default_rng(7)
    per = rows // files
    for k in range(files):
        ids = np.arange(k * per, (k + 1) * per, dtype=np.int64)
        table.append(
            pa.table(
                {
                    "id": ids,
                    "value": ids * 0.5,
                    "name": pa.array([f"name-{i % 100000:05d}" for i in ids.tolist()]),
                    "ts": pa.array(1_700_000_000_000_000 + ids * 1000, pa.timestamp("us", tz="UTC")),
                    "count": pa.array(rng.integers(0, 1000, per, dtype=np.int32)),
                },
                schema=SCHEMA,
            )
        )
    table.delete(predicate)
    return Table.open(uri).to_arrow(columns=["id"]).num_rows


def session() -> Any:
    return spark_session("bench-native-dv")


def jvm_cpu_seconds(spark: Any) -> Callable[[], float]:
    """CPU seconds of this process plus the Spark JVM (from /proc: all its threads)."""
    pid = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
    tick = os.sysconf("SC_CLK_TCK")

    def read() -> float:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return cpu_seconds() + (int(fields[11]) + int(fields[12])) / tick

    return read


def compile_udf(spark: Any, work: Path) -> bool:
    """Compile and ``ADD JAR`` the Java UDF; False without javac."""
    javac, jar = shutil.which("javac"), shutil.which("jar")
    if javac is None or jar is None:
        return False
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    src = work / "java" / "benchdv" / "KeepRow.java"
    src.parent.mkdir(parents=True)
    src.write_text(JAVA_UDF)
    classes = work / "java" / "classes"
    classpath = os.pathsep.join(str(p) for p in jars.glob("*.jar"))
    subprocess.run([javac, "--release", "17", "-cp", classpath, "-d", str(classes), str(src)], check=True)
    subprocess.run([jar, "cf", str(work / "keeprow.jar"), "-C", str(classes), "."], check=True)
    spark.sql(f"ADD JAR '{work / 'keeprow.jar'}'")  # a running session: py4j then sees the class
    return True


class Designs:
    """The DataFrame builders of one table."""

    def __init__(self, spark: Any, uri: str, udf: bool) -> None:
        import orjson
        from pyspark.sql import types as T

        from eventlog import Table
        from eventlog.log.storage import normalize_uri
        from spark_adapter.native import file_uri

        self.spark, self.uri = spark, uri
        self.fs, self.root, _ = normalize_uri(uri)
        snap = Table.open(uri).snapshot()
        self.files = list(snap.add_files)
        self.schema = T.StructType.fromJson(orjson.loads(snap.metadata.schema_string))
        self.paths = [file_uri("file:" + self.root, f.path) for f in self.files]
        self.udf_name: str | None = None
        if udf:
            self.udf_name = f"keep_row_{abs(hash(uri))}"
            self._register_udf()

    def read(self, schema: Any) -> Any:
        return self.spark.read.schema(schema).option("__globPaths__", "false").parquet(*self.paths)

    def build(self, design: str) -> Any:
        from pyspark.sql import functions as F
        from pyspark.sql import types as T

        from spark_adapter import native_dv, read_table

        if design == "parquet":
            return self.read(self.schema)
        if design == "read_table":
            return read_table(self.spark, self.uri)
        names = self.schema.fieldNames()
        (files,) = native_dv.dv_scans(self.fs, self.root, self.files)
        if design == "boxed-array":
            words, starts = native_dv.dv_words(self.fs, self.root, files)
            array = F.split(F.lit(",".join(map(str, words.tolist()))), ",").cast("array<bigint>")
            start = F.expr(native_dv.size_lookup(sorted(starts.items()), "a file of this scan"))
            index = (start + F.expr("_metadata.row_index div 64") + 1).cast("int")
            shift = F.expr("cast(_metadata.row_index % 64 as int)")
            return self.read(self.schema).where(F.bit_get(F.element_at(array, index), shift) == 0)
        if design == "tmp-row-index":
            words, starts = native_dv.dv_words(self.fs, self.root, files)
            array = native_dv._words_literal(words)
            row = F.col(TMP_ROW_INDEX)
            start = F.expr(native_dv.size_lookup(sorted(starts.items()), "a file of this scan"))
            index = (start + F.call_function("shiftright", row, F.lit(6))).cast("int")
            bit = F.call_function("shiftright", array[index], row.bitwiseAND(63).cast("int")).bitwiseAND(1)
            schema = T.StructType([*self.schema.fields, T.StructField(TMP_ROW_INDEX, T.LongType())])
            return self.read(schema).where(bit == 0).select(*names)
        if design == "java-udf":
            self._register_udf()  # as read_table would: the DVs decoded per read
            assert self.udf_name is not None
            keep = F.call_function(self.udf_name, F.col("_metadata.file_size"), F.col("_metadata.row_index"))
            return self.read(self.schema).where(keep)
        raise ValueError(design)

    def _register_udf(self) -> None:
        from spark_adapter import native_dv

        (files,) = native_dv.dv_scans(self.fs, self.root, self.files)
        words, starts = native_dv.dv_words(self.fs, self.root, files)
        jvm, gateway = self.spark.sparkContext._jvm, self.spark.sparkContext._gateway
        items = sorted(starts.items())
        sizes, firsts = gateway.new_array(jvm.long, len(items)), gateway.new_array(jvm.int, len(items))
        for i, (size, first) in enumerate(items):
            sizes[i], firsts[i] = size, first
        udf = jvm.benchdv.KeepRow(bytearray(words.astype("<i8").tobytes()), sizes, firsts)
        boolean = jvm.org.apache.spark.sql.types.DataType.fromJson('"boolean"')
        self.spark._jsparkSession.udf().register(self.udf_name, udf, boolean)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="500,000 rows in 4 files, 2 runs")
    parser.add_argument("--repeat", type=int, default=None, help="runs per measurement (default 5)")
    parser.add_argument("--rows", type=int, default=None, help="rows of each table (default 5,000,000)")
    parser.add_argument("--files", type=int, default=None, help="data files of each table (default 10)")
    args = parser.parse_args()
    repeat = args.repeat or (2 if args.quick else 5)
    rows = args.rows or (500_000 if args.quick else 5_000_000)
    nfiles = args.files or (4 if args.quick else 10)
    print(f"# bench_native_dv: {machine_note()}")
    work = Path(tempfile.mkdtemp(prefix="bench-native-dv-"))
    spark = session()
    try:
        print(f"pyspark {spark.version}; {rows:,} rows in {nfiles} files; repeat {repeat}")
        cpu = jvm_cpu_seconds(spark)
        udf = compile_udf(spark, work)
        designs = [d for d in DESIGNS if udf or d != "java-udf"]
        table_rows = []
        targets = []
        for pattern, predicate in PATTERNS:
            uri = str(work / pattern)
            live = build_table(uri, rows, nfiles, predicate)
            bench = Designs(spark, uri, udf)
            for design in designs:  # warm-up, untimed; and the row counts
                count = bench.build(design).count()
                want = rows if design == "parquet" else live
                if count != want:
                    print(f"ERROR: {pattern} {design}: {count} rows, expected {want}")
                    return 1
            wall: dict[str, list[float]] = {d: [] for d in designs}
            cpus: dict[str, list[float]] = {d: [] for d in designs}
            for rep in range(repeat):
                for design in rotated(designs, rep):
                    start, cpu0 = time.perf_counter(), cpu()
                    bench.build(design).write.format("noop").mode("overwrite").save()
                    wall[design].append(time.perf_counter() - start)
                    cpus[design].append(cpu() - cpu0)
                line = ", ".join(f"{d} {wall[d][-1]:.2f} s" for d in designs)
                print(f"  {pattern} run {rep + 1}: {line}", flush=True)
            base_wall, base_cpu = Stat.of(wall["parquet"]).median, Stat.of(cpus["parquet"]).median
            for d in designs:
                w, c = Stat.of(wall[d]), Stat.of(cpus[d])
                table_rows.append(
                    [
                        f"{pattern} (`{predicate}`)",
                        d,
                        w.fmt(".3f"),
                        c.fmt(".3f"),
                        f"{ratio(base_wall, w.median):.2f}x",
                        f"{ratio(base_cpu, c.median):.2f}x",
                        f"{(c.median - base_cpu) / rows * 1e9:+.0f}",
                    ]
                )
            shipped = ratio(base_wall, Stat.of(wall["read_table"]).median)
            targets.append([pattern, f"{shipped:.2f}x", f">= {TARGET}x", verdict(shipped >= TARGET)])
        print_table(
            f"Full scan into noop, {rows:,} rows x 5 columns in {nfiles} files, 10% deleted by DVs: "
            f"median [min-max] of {repeat} runs",
            ["deletes", "design", "wall s", "CPU s (Python + JVM)", "throughput vs parquet (wall)",
             "vs parquet (CPU)", "CPU ns/row over parquet"],
            table_rows,
        )  # fmt: skip
        print_table(
            "Target: read_table throughput vs plain Parquet scan (wall)",
            ["deletes", "measured", "goal", "verdict"],
            targets,
        )
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"# end: {machine_note()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
