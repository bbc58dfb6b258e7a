"""Type widening both ways with Delta Spark: it reads the tables whose columns we widened
(older files in the narrower Parquet types) and widens them further; we read its widened
tables and write to them."""

from __future__ import annotations

import datetime as dt
import decimal
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from eventlog import Table
from tests.deltaspark.peer import delta_arrow, delta_detail, same_rows

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

SCHEMA = pa.schema(
    [
        pa.field("i8", pa.int8()),
        pa.field("i32", pa.int32()),
        pa.field("f", pa.float32()),
        pa.field("d", pa.date32()),
        pa.field("dec", pa.decimal128(5, 2)),
        pa.field("p", pa.int16()),
    ]
)
ROW = {"i8": 1, "i32": 10, "f": 1.5, "d": dt.date(2024, 1, 1), "dec": decimal.Decimal("1.25"), "p": 1}


def test_delta_spark_reads_and_widens_our_widened_table(spark: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    t = Table.create(path, SCHEMA, partition_by=["p"], properties={"delta.enableTypeWidening": "true"})
    t.append(pa.Table.from_pylist([ROW], SCHEMA))
    t.change_column_type("i8", pa.int16())
    t.change_column_type("i32", pa.int64())
    t.change_column_type("f", pa.float64())
    t.change_column_type("d", pa.timestamp("us"))
    t.change_column_type("dec", pa.decimal128(10, 4))
    t.change_column_type("p", pa.int32())
    assert "typeWidening" in delta_detail(spark, path)["tableFeatures"]
    ours, theirs = same_rows(t.to_arrow(), delta_arrow(spark, path))
    assert ours == theirs
    assert [f.dataType.simpleString() for f in spark.read.format("delta").load(path).schema.fields] == [
        "smallint", "bigint", "double", "timestamp_ntz", "decimal(10,4)", "int"
    ]  # fmt: skip

    # Delta Spark widens further (our recorded changes are its history) and writes wide values.
    spark.sql(f"ALTER TABLE delta.`{path}` ALTER COLUMN i8 TYPE INT")
    spark.sql(
        f"INSERT INTO delta.`{path}` VALUES (100000, 3000000000, 1e300,"
        " TIMESTAMP_NTZ'2024-01-02 03:04:05', 12345.6789, 70000)"
    )
    fresh = Table.open(path)
    assert fresh.schema.field("i8").type == pa.int32()
    ours, theirs = same_rows(fresh.to_arrow(), delta_arrow(spark, path))
    assert ours == theirs
    assert sorted(r["i8"] for r in ours) == [1, 100000]
    # Delta Spark kept every change in order.
    changes = json.loads(fresh.schema.field("i8").metadata[b"delta.typeChanges"])
    assert [(c["fromType"], c["toType"]) for c in changes] == [("byte", "short"), ("short", "integer")]
    # And we write on after it.
    fresh.append(pa.Table.from_pylist([{**ROW, "i8": 7, "d": dt.datetime(2024, 2, 1, 12)}], fresh.schema))
    ours, theirs = same_rows(Table.open(path).to_arrow(), delta_arrow(spark, path))
    assert ours == theirs and len(ours) == 3


def test_we_read_and_write_delta_spark_widened_tables(spark: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    table = f"delta.`{path}`"
    spark.sql(
        f"CREATE TABLE {table} (b TINYINT, d DATE, dec DECIMAL(4,1)) USING delta"
        " TBLPROPERTIES ('delta.enableTypeWidening' = 'true', 'delta.feature.timestampNtz' = 'supported')"
    )
    spark.sql(f"INSERT INTO {table} VALUES (1, DATE'2024-01-01', 123.4)")
    spark.sql(f"ALTER TABLE {table} ALTER COLUMN b TYPE BIGINT")
    spark.sql(f"ALTER TABLE {table} ALTER COLUMN d TYPE TIMESTAMP_NTZ")
    spark.sql(f"ALTER TABLE {table} ALTER COLUMN dec TYPE DECIMAL(8,3)")
    ours = Table.open(path)
    assert ours.schema.types == [pa.int64(), pa.timestamp("us"), pa.decimal128(8, 3)]
    mine, theirs = same_rows(ours.to_arrow(), delta_arrow(spark, path))
    assert mine == theirs == [{"b": 1, "d": dt.datetime(2024, 1, 1), "dec": decimal.Decimal("123.400")}]
    ours.append(
        pa.Table.from_pylist(
            [{"b": 5_000_000_000, "d": dt.datetime(2024, 5, 6, 7, 8), "dec": decimal.Decimal("12345.678")}],
            ours.schema,
        )
    )
    ours.change_column_type("dec", pa.decimal128(12, 3))
    mine, theirs = same_rows(Table.open(path).to_arrow(), delta_arrow(spark, path))
    assert mine == theirs and sorted(r["b"] for r in mine) == [1, 5_000_000_000]
    assert spark.read.format("delta").load(path).schema["dec"].dataType.simpleString() == "decimal(12,3)"
