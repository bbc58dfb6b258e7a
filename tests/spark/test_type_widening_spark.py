"""Type widening on Spark: widened tables read the same through Spark's Parquet reader
(``read_table``: older files hold the narrower Parquet types) and the Python source, Spark
writes the wider values, and ``EventlogTable.changeColumnType`` takes Spark types; the
streaming source stops at a type change as at any schema change."""

from __future__ import annotations

import datetime as dt
import decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql.types import DecimalType, DoubleType, LongType, TimestampNTZType

from eventlog import Table, TypeChangeError
from spark_adapter import EventlogTable, read_table
from streaming import SourceMetadataChangedError, recover

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


def test_streaming_source_and_sink_across_a_widening(spark: Any, tmp_path: Path) -> None:
    """A type change is a schema change to our streaming source: a running query stops at it
    (SourceMetadataChangedError, as for any schema change), and a fresh query reads the older
    files as the wider type. The sink writes the wider values once its table is widened too."""
    src, dst, checkpoint = str(tmp_path / "src"), str(tmp_path / "dst"), str(tmp_path / "cp")
    schema = pa.schema([("id", pa.int64()), ("v", pa.int32())])
    widening = {"delta.enableTypeWidening": "true"}
    source = Table.create(src, schema, properties=widening)
    source.append(pa.table({"id": [1, 2], "v": pa.array([10, 20], pa.int32())}))
    Table.create(dst, schema, properties=widening).close()

    def run(df: Any) -> Any:
        query = (
            df.writeStream.format("eventlog")
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start(dst)
        )
        try:
            assert query.awaitTermination(120), "the query did not finish in time"
        finally:
            query.stop()
        return query

    before = spark.readStream.format("eventlog").load(src)
    run(before)
    source.change_column_type("v", pa.int64())
    source.append(pa.table({"id": [3], "v": [5_000_000_000]}))
    with pytest.raises(StreamingQueryException) as info:
        run(before)
    error = recover(info.value)
    assert isinstance(error, SourceMetadataChangedError)
    assert (error.version, error.changed) == (2, ["schema"])
    Table.open(dst).change_column_type("v", pa.int64())
    run(spark.readStream.format("eventlog").load(src))  # a fresh load: the wider schema
    out = Table.open(dst)
    assert out.schema.field("v").type == pa.int64()
    assert sorted(out.to_arrow().to_pylist(), key=lambda r: r["id"]) == [
        {"id": 1, "v": 10},
        {"id": 2, "v": 20},
        {"id": 3, "v": 5_000_000_000},
    ]
