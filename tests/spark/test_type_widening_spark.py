"""Type widening on Spark: widened tables read the same through Spark's Parquet reader
(``read_table``: older files hold the narrower Parquet types) and the Python source, Spark
writes the wider values, and ``EventlogTable.changeColumnType`` takes Spark types."""

from __future__ import annotations

import datetime as dt
import decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql.types import DecimalType, DoubleType, LongType, TimestampNTZType

from eventlog import Table, TypeChangeError
from spark_adapter import EventlogTable, read_table

pytestmark = pytest.mark.spark

SCHEMA = pa.schema(
    [
        pa.field("i32", pa.int32()),
        pa.field("f", pa.float32()),
        pa.field("d", pa.date32()),
        pa.field("dec", pa.decimal128(5, 2)),
        pa.field("p", pa.int16()),
    ]
)


def _rows(spark_df: Any) -> list[tuple[Any, ...]]:
    return sorted(tuple(r) for r in spark_df.collect())


def test_widened_tables_read_the_same_natively_and_through_python(spark: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    t = Table.create(path, SCHEMA, partition_by=["p"], properties={"delta.enableTypeWidening": "true"})
    t.append(
        pa.Table.from_pylist(
            [{"i32": 1, "f": 1.5, "d": dt.date(2024, 1, 1), "dec": decimal.Decimal("1.25"), "p": 1}], SCHEMA
        )
    )
    handle = EventlogTable.forPath(spark, path)
    handle.changeColumnType("i32", LongType())
    handle.changeColumnType("f", DoubleType())
    handle.changeColumnType("d", TimestampNTZType())
    handle.changeColumnType("dec", DecimalType(10, 4))
    handle.changeColumnType("p", LongType())
    with pytest.raises(TypeChangeError) as info:
        handle.changeColumnType("i32", DoubleType())  # long -> double: not allowed
    assert (info.value.from_type, info.value.to_type) == ("long", "double")
    # Spark writes the wider values next to the older, narrower files.
    wide = spark.createDataFrame(
        [(3_000_000_000, 1e300, dt.datetime(2024, 1, 3, 5, 6), decimal.Decimal("12345.6789"), 5_000_000_000)],
        "i32 BIGINT, f DOUBLE, d TIMESTAMP_NTZ, dec DECIMAL(10,4), p BIGINT",
    )
    wide.write.format("eventlog").mode("append").save(path)
    expected = [
        (1, 1.5, dt.datetime(2024, 1, 1), decimal.Decimal("1.2500"), 1),
        (3_000_000_000, 1e300, dt.datetime(2024, 1, 3, 5, 6), decimal.Decimal("12345.6789"), 5_000_000_000),
    ]
    native = read_table(spark, path)
    assert [f.dataType for f in native.schema.fields] == [
        LongType(),
        DoubleType(),
        TimestampNTZType(),
        DecimalType(10, 4),
        LongType(),
    ]
    assert _rows(native) == expected
    assert _rows(spark.read.format("eventlog").load(path)) == expected
    assert _rows(read_table(spark, path, where="i32 > 2000000000")) == expected[1:]
    assert _rows(read_table(spark, path, where="p = 1")) == expected[:1]
    ours = Table.open(path).to_arrow()
    assert sorted(tuple(r.values()) for r in ours.to_pylist()) == expected
