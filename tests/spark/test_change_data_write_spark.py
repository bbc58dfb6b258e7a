"""Change data feed and Spark writes: the batch writer's appends and overwrites record their
changes as the engine does; DELETE, UPDATE and MERGE in Spark jobs, which do not write
change data yet, refuse a table with the feed on before writing anything."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from eventlog import Table, UnsupportedProtocolError
from spark_adapter import EventlogTable

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("v", pa.int64())])
CDF = {"delta.enableChangeDataFeed": "true"}


def _changes(uri: str, start: int) -> list[tuple[int, str, int, int]]:
    table = pa.table(DeltaTable(uri).load_cdf(starting_version=start).read_all())
    return sorted((r["_commit_version"], r["_change_type"], r["id"], r["v"]) for r in table.to_pylist())


def test_spark_writer_records_changes(spark: Any, tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    Table.create(uri, SCHEMA, properties=CDF).append(pa.table({"id": [1, 2], "v": [10, 20]}, schema=SCHEMA))
    spark.createDataFrame([(3, 30)], "id long, v long").write.format("eventlog").mode("append").save(uri)
    new = spark.createDataFrame([(2, 99)], "id long, v long")
    new.write.format("eventlog").mode("overwrite").option("replaceWhere", "id = 2").save(uri)
    assert _changes(uri, 2) == [(2, "insert", 3, 30), (3, "delete", 2, 20), (3, "insert", 2, 99)]


def test_spark_dml_refuses_a_change_data_table_and_changes_nothing(spark: Any, tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    t = Table.create(uri, SCHEMA, properties=CDF)
    t.append(pa.table({"id": [1, 2], "v": [10, 20]}, schema=SCHEMA))
    handle = EventlogTable.forPath(spark, uri)
    source = spark.createDataFrame([(1, 5)], "id long, v long")
    attempts = [
        lambda: handle.delete("id = 1"),
        lambda: handle.update("id = 1", {"v": "v + 1"}),
        lambda: (
            handle.alias("t")
            .merge(source.alias("s"), "t.id = s.id")
            .whenMatchedUpdate(set={"v": "s.v"})
            .execute()
        ),
    ]
    for attempt in attempts:
        with pytest.raises(UnsupportedProtocolError) as err:
            attempt()
        assert err.value.features == ["changeDataFeed"]
        assert "Python API" in str(err.value)
    assert t.refresh().version == 1
    assert sorted(t.to_arrow().column("id").to_pylist()) == [1, 2]
    data_files = [p for p in Path(uri).rglob("*.parquet") if "_delta_log" not in p.parts]
    assert len(data_files) == 1  # the append's: nothing written by the refused operations
