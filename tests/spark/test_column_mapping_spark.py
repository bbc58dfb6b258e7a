"""Column-mapped tables through Spark: the batch source (Python and native read paths, DVs
too), the writer, DML through ``EventlogTable`` and its renameColumn/dropColumns, and the
streaming sink and source. Files store physical names; Spark shows logical ones."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from eventlog import Table
from eventlog.files.column_mapping import field_id, physical_name
from spark_adapter import EventlogTable
from spark_adapter.native import NATIVE_CONF
from tests.spark.test_native_read import assert_same

pytestmark = pytest.mark.spark


def _mapped_table(path: Path) -> Table:
    t = Table.create(
        str(path),
        data=pa.table(
            {
                "id": pa.array([1, 2, 3, 4], pa.int64()),
                "p": ["x", "y", "x", "y"],
                "s": [{"a": 1, "b": "q"}, None, {"a": 3, "b": "r"}, {"a": 4, "b": None}],
                "v": ["one", "two", "three", "four"],
            }
        ),
        partition_by=["p"],
        properties={"delta.columnMapping.mode": "name", "delta.enableDeletionVectors": "true"},
    )
    t.rename_column("id", "ident")
    t.rename_column("s.a", "a2")
    t.rename_column("p", "part")
    t.drop_columns(["v"])
    t.delete("ident = 2")  # a deletion vector
    return t


def _rows(df: Any) -> list[dict[str, Any]]:
    return sorted((r.asDict(recursive=True) for r in df.collect()), key=repr)


EXPECTED = [
    {"ident": 1, "part": "x", "s": {"a2": 1, "b": "q"}},
    {"ident": 3, "part": "x", "s": {"a2": 3, "b": "r"}},
    {"ident": 4, "part": "y", "s": {"a2": 4, "b": None}},
]


def test_both_read_paths_show_logical_names_of_a_mapped_table(spark: Any, tmp_path: Path) -> None:
    t = _mapped_table(tmp_path / "t")
    rows = assert_same(spark, str(tmp_path / "t"), expect_rows=3)
    assert sorted(rows, key=repr) == sorted(EXPECTED, key=repr)
    df = spark.read.format("eventlog").load(str(tmp_path / "t"))
    assert df.columns == ["ident", "part", "s"]
    assert _rows(df.where("part = 'x' AND s.a2 > 1")) == [{"ident": 3, "part": "x", "s": {"a2": 3, "b": "r"}}]
    assert t.version == 5


def test_spark_writes_and_dml_on_a_mapped_table(spark: Any, tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    _mapped_table(tmp_path / "t")
    new = spark.createDataFrame(
        [(5, "z", (5, "e"))], "ident BIGINT, part STRING, s STRUCT<a2: INT, b: STRING>"
    )
    new.write.format("eventlog").mode("append").save(uri)
    et = EventlogTable.forPath(spark, uri)
    et.update("ident = 5", {"s": "named_struct('a2', 50, 'b', 'f')"})
    et.delete("ident = 1")
    et.renameColumn("ident", "key")
    et.dropColumns("s.b")
    expected = [
        {"key": 3, "part": "x", "s": {"a2": 3}},
        {"key": 4, "part": "y", "s": {"a2": 4}},
        {"key": 5, "part": "z", "s": {"a2": 50}},
    ]
    for native in ("true", "false"):
        spark.conf.set(NATIVE_CONF, native)
        try:
            assert _rows(spark.read.format("eventlog").load(uri)) == expected
        finally:
            spark.conf.unset(NATIVE_CONF)
    assert Table.open(uri).to_arrow().sort_by("key").to_pylist() == expected
    # Partition values are keyed by the physical name of the renamed partition column.
    snap = Table.open(uri).snapshot()
    key = physical_name(snap.schema.field("part"))
    assert key.startswith("col-")
    assert all(set(a.partition_values) == {key} for a in snap.add_files)


def test_streaming_sink_and_source_on_a_mapped_table(spark: Any, tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    _mapped_table(tmp_path / "t")
    src = spark.readStream.format("eventlog").load(uri)
    out = str(tmp_path / "out")
    q = (
        src.writeStream.format("eventlog")
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start(out)
    )
    q.awaitTermination(120)
    assert q.exception() is None
    got = Table.open(out).to_arrow().sort_by("ident").to_pylist()
    assert got == sorted(EXPECTED, key=lambda r: r["ident"])


def test_spark_merge_schema_gives_new_columns_physical_names(spark: Any, tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    _mapped_table(tmp_path / "t")
    ddl = "ident BIGINT, part STRING, s STRUCT<a2: INT, b: STRING>, extra DOUBLE"
    df = spark.createDataFrame([(7, "x", None, 1.5)], ddl)
    df.write.format("eventlog").mode("append").option("mergeSchema", "true").save(uri)
    t = Table.open(uri)
    extra = t.schema.field("extra")
    assert physical_name(extra).startswith("col-") and field_id(extra) == 7
    assert t.snapshot().metadata.configuration["delta.columnMapping.maxColumnId"] == "7"
    assert [(r["ident"], r["extra"]) for r in t.to_arrow().sort_by("ident").to_pylist()] == [
        (1, None), (3, None), (4, None), (7, 1.5),
    ]  # fmt: skip
    assert _rows(spark.read.format("eventlog").load(uri).select("ident", "extra").where("extra > 1")) == [
        {"ident": 7, "extra": 1.5}
    ]
