"""Native reads (``read_table``, ``EventlogTable.toDF``) against the Python data source.

Every table here is read both ways and compared row for row, value for value: types,
partition values of every kind, deletion vectors, time travel, schema evolution, empty
snapshots and vacuumed files.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from eventlog import Table
from eventlog.errors import DataFileNotFoundError, InvalidInputError, VersionNotFoundError
from spark_adapter import EventlogTable, read_table
from spark_adapter import native as native_module
from spark_adapter.jvm_reader import DV_READER_CONF
from spark_adapter.types import nullable_schema
from tests.spark.test_datasource import ALL_TYPES, SPARK_ERRORS, typed_rows

pytestmark = pytest.mark.spark

DV = {"delta.enableDeletionVectors": "true"}


def python_rows(spark: Any, uri: str, **options: Any) -> tuple[Any, list[dict[str, Any]]]:
    df = spark.read.format("eventlog").options(**{k: str(v) for k, v in options.items()}).load(uri)
    return df.schema, _sorted(df.collect())


def native_rows(spark: Any, uri: str, **kw: Any) -> tuple[Any, list[dict[str, Any]]]:
    df = read_table(spark, uri, **kw)
    return df.schema, _sorted(df.collect())


def _sorted(rows: list[Any]) -> list[dict[str, Any]]:
    return sorted((r.asDict(recursive=True) for r in rows), key=lambda r: repr(sorted(r.items())))


def assert_same(spark: Any, uri: str, *, expect_rows: int | None = None, **kw: Any) -> list[dict[str, Any]]:
    """Both paths give the same schema and the same rows; returns the rows."""
    options = {}
    if kw.get("version") is not None:
        options["versionAsOf"] = kw["version"]
    if kw.get("timestamp") is not None:
        options["timestampAsOf"] = kw["timestamp"]
    py_schema, py = python_rows(spark, uri, **options)
    nat_schema, nat = native_rows(spark, uri, **kw)
    # The same types; every column nullable natively, as in all of Spark's file sources.
    assert nat_schema == nullable_schema(py_schema)
    assert nat == py
    if expect_rows is not None:
        assert len(nat) == expect_rows
    return nat


def scanned_files(df: Any) -> int:
    """Files Spark plans for a DataFrame (its FileSourceScan nodes' inputFiles)."""
    return len(df.inputFiles())


# --------------------------------------------------------------------------- types and partitions


def test_all_types_and_partition_values_read_the_same_both_ways(spark: Any, tmp_path: Path) -> None:
    uri = str(tmp_path / "types")
    spark.createDataFrame(typed_rows(range(0, 10), "a"), ALL_TYPES).write.format("eventlog").mode(
        "append"
    ).option("partitionBy", "p").save(uri)
    spark.createDataFrame(typed_rows(range(10, 14), "b/ü %3A [x]*"), ALL_TYPES).write.format("eventlog").mode(
        "append"
    ).save(uri)
    rows = assert_same(spark, uri, expect_rows=14)
    assert {r["p"] for r in rows} == {"a", "b/ü %3A [x]*"}
    assert EventlogTable.forPath(spark, uri).toDF().count() == 14


PARTITION_TYPES = pa.schema(
    [
        ("id", pa.int64()),
        ("s", pa.string()),
        ("i", pa.int32()),
        ("b", pa.bool_()),
        ("d", pa.date32()),
        ("ts", pa.timestamp("us", tz="UTC")),
        ("ntz", pa.timestamp("us")),
        ("dec", pa.decimal128(10, 2)),
        ("f", pa.float64()),
    ]
)


def test_typed_partition_columns_and_nulls_come_from_partition_values(spark: Any, tmp_path: Path) -> None:
    uri = str(tmp_path / "parts")
    data = pa.table(
        {
            "id": [1, 2, 3],
            "s": ["x", None, "z=1/2"],
            "i": [7, -1, None],
            "b": [True, None, False],
            "d": [dt.date(2024, 2, 29), None, dt.date(1969, 12, 31)],
            "ts": [dt.datetime(2024, 1, 1, 23, 59, 59, 999999, tzinfo=dt.UTC), None, None],
            "ntz": [dt.datetime(2001, 9, 9, 1, 46, 40), None, dt.datetime(1900, 1, 1)],
            "dec": [Decimal("12.34"), None, Decimal("-0.01")],
            "f": [1.5, None, -0.0],
        },
        schema=PARTITION_TYPES,
    )
    Table.create(uri, PARTITION_TYPES, partition_by=["s", "i", "b", "d", "ts", "ntz", "dec"], data=data)
    rows = assert_same(spark, uri, expect_rows=3)
    by_id = {r["id"]: r for r in rows}
    assert by_id[1]["ts"] == dt.datetime(2024, 1, 1, 23, 59, 59, 999999)  # session time zone is UTC
    assert by_id[1]["ntz"] == dt.datetime(2001, 9, 9, 1, 46, 40)
    assert by_id[2]["s"] is None and by_id[3]["i"] is None and by_id[2]["d"] is None
    assert by_id[3]["dec"] == Decimal("-0.01") and by_id[3]["s"] == "z=1/2"


def test_many_partitions_use_one_scan_and_a_join(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = str(tmp_path / "many")
    ids = list(range(12))
    data = pa.table({"id": ids, "p": [f"v{n % 6}" for n in ids], "q": [n % 2 for n in ids]})
    Table.create(uri, data.schema, partition_by=["p", "q"], data=data)
    monkeypatch.setattr(native_module, "MAX_PARTITION_SCANS", 2)
    df = read_table(spark, uri)
    assert "BroadcastHashJoin" in df._jdf.queryExecution().executedPlan().toString()
    assert_same(spark, uri, expect_rows=12)


# --------------------------------------------------------------------------- pruning


def test_paths_are_qualified_per_directory_exactly_as_hadoop_spells_them(spark: Any, tmp_path: Path) -> None:
    """The many-partition join matches rows to files by ``_metadata.file_path``: qualifying a
    directory once and appending plain file names must give Hadoop's own spelling."""
    root = tmp_path / "q"
    names = ["part-00000-0f3c.c000.snappy.parquet", "odd name ü%3A.parquet", "x[1]*.parquet"]
    dirs = ["p=a", "p=ü %3A [x]*", "p=a/q=2024-01-01 00%3A00%3A00"]
    paths = [f"file://{root}/{d}/{n}" for d in dirs for n in names]
    jvm = spark.sparkContext._jvm
    conf = spark.sparkContext._jsc.hadoopConfiguration()

    def one_by_one(p: str) -> str:
        hp = jvm.org.apache.hadoop.fs.Path(p)
        return str(hp.getFileSystem(conf).makeQualified(hp).toUri().toString())

    assert native_module._qualified_paths(spark, paths) == [one_by_one(p) for p in paths]


def test_where_prunes_partitions_and_skips_files_before_spark_plans(spark: Any, tmp_path: Path) -> None:
    uri = str(tmp_path / "pruned")
    table = Table.create(uri, pa.schema([("id", pa.int64()), ("p", pa.string())]), partition_by=["p"])
    for p in ("a", "b", "c"):
        for start in (0, 100):
            table.append(pa.table({"id": list(range(start, start + 10)), "p": [p] * 10}))
    everything = read_table(spark, uri)
    assert scanned_files(everything) == 6
    only_b = read_table(spark, uri, where="p = 'b'")
    assert scanned_files(only_b) == 2  # the partition's two files, no others listed
    assert sorted(r.id for r in only_b.collect()) == [*range(10), *range(100, 110)]
    by_stats = read_table(spark, uri, where="p = 'b' AND id >= 100")
    assert scanned_files(by_stats) == 1  # min/max statistics skip the other file
    assert sorted(r.id for r in by_stats.collect()) == list(range(100, 110))
    nothing = read_table(spark, uri, where="id > 1000")
    assert nothing.collect() == [] and nothing.schema == everything.schema


def test_where_that_is_not_valid_sql_is_a_predicate_error(spark: Any, tmp_path: Path) -> None:
    uri = str(tmp_path / "bad")
    Table.create(uri, pa.schema([("id", pa.int64())]), data=pa.table({"id": [1]}))
    with pytest.raises(InvalidInputError) as info:
        read_table(spark, uri, where="id >>> 3")
    assert "id >>> 3" in str(info.value)
    # storage_options are accepted (they reach the Python data source's tasks, which read
    # the table instead of Spark's Parquet reader: Hadoop cannot take fsspec options).
    assert [r.id for r in read_table(spark, uri, storage_options={"auto_mkdir": False}).collect()] == [1]


# --------------------------------------------------------------------------- deletion vectors


@pytest.fixture(params=["jvm", "sql"])
def dv_reader(request: pytest.FixtureRequest, spark: Any) -> Iterator[str]:
    """Deletion vectors applied by the JVM reader (default) or by the SQL filter."""
    spark.conf.set(DV_READER_CONF, str(request.param))
    try:
        yield str(request.param)
    finally:
        spark.conf.unset(DV_READER_CONF)


def test_deletion_vectors_are_applied_inside_spark(spark: Any, tmp_path: Path, dv_reader: str) -> None:
    uri = str(tmp_path / "dv")
    schema = pa.schema([("id", pa.int64()), ("p", pa.string())])
    table = Table.create(uri, schema, partition_by=["p"], properties=DV)
    table.append(pa.table({"id": list(range(0, 1000)), "p": ["a"] * 1000}))
    table.append(pa.table({"id": list(range(1000, 1100)), "p": ["b"] * 100}))
    table.append(pa.table({"id": list(range(2000, 2100)), "p": ["a"] * 100}))  # stays DV-free
    table.delete("id % 7 = 3 AND id < 1100")
    table.delete("id = 0 OR id = 999")  # a second DV on the same file replaces the first
    assert sum(1 for f in table.snapshot().add_files if f.deletion_vector is not None) == 2
    rows = assert_same(spark, uri)
    deleted = {n for n in range(1100) if n % 7 == 3} | {0, 999}
    want = [n for n in [*range(1100), *range(2000, 2100)] if n not in deleted]
    assert sorted(r["id"] for r in rows) == want
    plan = read_table(spark, uri)._jdf.queryExecution().executedPlan().toString()
    # The JVM reader drops deleted rows inside the scan: no filter on the row index.
    assert ("Format: DvParquet" in plan, "row_index" in plan) == (dv_reader == "jvm", dv_reader == "sql")


def test_columns_the_jvm_reader_cannot_compact_use_the_sql_filter(spark: Any, tmp_path: Path) -> None:
    uri = str(tmp_path / "dv-decimal")
    schema = pa.schema(
        [("id", pa.int64()), ("amount", pa.decimal128(10, 2)), ("tags", pa.list_(pa.string()))]
    )
    data = pa.table(
        {"id": [1, 2, 3], "amount": [Decimal("1.50"), None, Decimal("-2.25")], "tags": [["a"], [], None]},
        schema=schema,
    )
    table = Table.create(uri, schema, data=data, properties=DV)
    table.delete("id = 2")
    rows = assert_same(spark, uri, expect_rows=2)
    got = sorted((r["id"], r["amount"], r["tags"]) for r in rows)
    assert got == [(1, Decimal("1.50"), ["a"]), (3, Decimal("-2.25"), None)]
    plan = read_table(spark, uri)._jdf.queryExecution().executedPlan().toString()
    assert "row_index" in plan and "DvParquet" not in plan


def test_files_of_equal_size_with_deletion_vectors_are_told_apart(spark: Any, tmp_path: Path) -> None:
    uri = str(tmp_path / "same-size")
    table = Table.create(uri, pa.schema([("id", pa.int64())]), properties=DV)
    batch = pa.table({"id": list(range(50))})
    table.append(batch)
    table.append(batch)  # byte-identical content: two files of one size
    sizes = {f.size for f in table.snapshot().add_files}
    assert len(sizes) == 1
    table.update("id < 3", {"id": "id + 100"})  # DVs on both files
    assert all(f.deletion_vector is not None for f in table.snapshot().add_files if f.size in sizes)
    rows = assert_same(spark, uri, expect_rows=100)
    assert sorted(r["id"] for r in rows).count(100) == 2


# --------------------------------------------------------------------------- versions and evolution


def test_time_travel_by_version_and_timestamp(spark: Any, tmp_path: Path) -> None:
    uri = str(tmp_path / "tt")
    table = Table.create(uri, pa.schema([("id", pa.int64())]), data=pa.table({"id": [1, 2]}), properties=DV)
    time.sleep(0.02)
    between = dt.datetime.now(dt.UTC)
    time.sleep(0.02)
    table.append(pa.table({"id": [3]}))
    table.delete("id = 1")
    assert [r["id"] for r in assert_same(spark, uri, version=0)] == [1, 2]
    assert [r["id"] for r in assert_same(spark, uri, version=1)] == [1, 2, 3]
    assert [r["id"] for r in assert_same(spark, uri)] == [2, 3]
    assert [r["id"] for r in assert_same(spark, uri, timestamp=between.isoformat())] == [1, 2]
    with pytest.raises(VersionNotFoundError):
        read_table(spark, uri, version=9)


def test_columns_added_later_read_as_null_in_older_files(spark: Any, tmp_path: Path) -> None:
    uri = str(tmp_path / "evolved")
    table = Table.create(uri, pa.schema([("id", pa.int64())]), data=pa.table({"id": [1]}))
    table.append(pa.table({"id": [2], "extra": ["x"]}), schema_mode="merge")
    rows = assert_same(spark, uri, expect_rows=2)
    assert {r["id"]: r["extra"] for r in rows} == {1: None, 2: "x"}


def test_a_snapshot_without_files_is_an_empty_dataframe_with_the_table_schema(
    spark: Any, tmp_path: Path
) -> None:
    uri = str(tmp_path / "empty")
    table = Table.create(uri, pa.schema([("id", pa.int64()), ("p", pa.string())]), partition_by=["p"])
    assert assert_same(spark, uri, expect_rows=0) == []
    table.append(pa.table({"id": [1], "p": ["a"]}))
    table.delete()
    assert assert_same(spark, uri, expect_rows=0) == []
    assert read_table(spark, uri).schema.fieldNames() == ["id", "p"]


def test_vacuumed_files_are_a_data_file_not_found_error_on_both_paths(spark: Any, tmp_path: Path) -> None:
    uri = str(tmp_path / "vacuumed")
    table = Table.create(uri, pa.schema([("id", pa.int64())]), data=pa.table({"id": [1]}))
    table.overwrite(pa.table({"id": [2]}))
    time.sleep(0.01)  # the removal must be older than the (zero) retention
    assert len(table.vacuum(0, enforce_retention=False)) == 1
    with pytest.raises(DataFileNotFoundError) as info:
        read_table(spark, uri, version=0)
    assert info.value.version == 0 and info.value.path.endswith(".parquet")
    with pytest.raises(SPARK_ERRORS, match="DataFileNotFoundError"):
        spark.read.format("eventlog").option("versionAsOf", 0).load(uri).collect()
    assert [r.id for r in read_table(spark, uri).collect()] == [2]


# --------------------------------------------------------------------------- fallback


def test_tables_spark_cannot_open_fall_back_to_the_python_source(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    uri = str(tmp_path / "fallback")
    Table.create(uri, pa.schema([("id", pa.int64())]), data=pa.table({"id": [5, 6]}))
    assert native_module.hadoop_uri(spark, uri) == "file:" + uri
    assert native_module.hadoop_uri(spark, "memory://x/y") is None  # no Hadoop FileSystem
    assert native_module.hadoop_uri(spark, "nosuchfs://bucket/t") is None
    original = native_module.hadoop_uri
    try:
        native_module.hadoop_uri = lambda spark, uri: None  # type: ignore[assignment]
        with caplog.at_level(logging.INFO, logger="spark_adapter.native"):
            df = read_table(spark, uri, where="id > 5")
    finally:
        native_module.hadoop_uri = original  # type: ignore[assignment]
    assert "Python data source" in caplog.text
    assert "BatchScan" in df._jdf.queryExecution().executedPlan().toString()
    assert [r.id for r in df.collect()] == [6]


# --------------------------------------------------------------------------- DML on split files


@pytest.mark.parametrize("properties", [{}, DV], ids=["copy-on-write", "deletion-vectors"])
def test_dml_is_right_when_spark_splits_one_file_over_many_tasks(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, properties: dict[str, str]
) -> None:
    from eventlog.files import datafiles

    monkeypatch.setattr(datafiles, "_MAX_ROW_GROUP_ROWS", 500)  # 20 row groups in one file
    uri = str(tmp_path / "split")
    ids = list(range(10_000))
    data = pa.table({"id": ids, "x": [n % 100 for n in ids]})
    table = Table.create(uri, data.schema, data=data, properties=properties)
    assert table.snapshot().num_files == 1
    spark.conf.set("spark.sql.files.maxPartitionBytes", "8k")
    try:
        assert read_table(spark, uri).rdd.getNumPartitions() > 4  # the file is split
        handle = EventlogTable.forPath(spark, uri)
        deleted = handle.delete("x = 7")
        updated = handle.update("x = 8", {"id": "id + 1000000"})
    finally:
        spark.conf.unset("spark.sql.files.maxPartitionBytes")
    with Table.open(uri) as after:
        got = sorted(after.to_arrow().column("id").to_pylist())
        history = after.history(2)
    want = sorted([n for n in ids if n % 100 not in (7, 8)] + [n + 1_000_000 for n in ids if n % 100 == 8])
    assert got == want
    assert deleted.version == 1 and updated.version == 2
    metrics = {h["operation"]: h["operationMetrics"] for h in history}
    assert int(metrics["DELETE"]["numDeletedRows"]) == 100
    assert int(metrics["UPDATE"]["numUpdatedRows"]) == 100
    copied = 0 if properties else 10_000 - 100
    assert int(metrics["DELETE"]["numCopiedRows"]) == copied
    assert assert_same(spark, uri, expect_rows=9_900) is not None
