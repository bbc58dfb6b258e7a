"""Identity columns on Spark: the batch writer and the streaming sink reserve values inside
the tasks (one range per task and column, recorded in the commit), never collide with the
engine's values, and refuse supplied ``GENERATED ALWAYS`` values; EventlogTable's UPDATE
refuses assigning an identity column and its MERGE refuses inserts it would have to
generate values for (the engine's ``Table.merge`` does)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException

from eventlog import IdentityColumnError, Table, identity_field
from eventlog.files.identity import identity_columns
from spark_adapter import EventlogTable
from spark_adapter.errors import recover_error

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

SPARK_ERRORS = (PySparkException, Py4JJavaError)
SCHEMA = pa.schema([identity_field("id", start=5, step=10), ("k", pa.int64())])


def _mark(path: str) -> int | None:
    with Table.open(path) as t:
        (column,) = identity_columns(t.refresh().schema)
        return column.high_water_mark


def _rows(path: str) -> list[dict[str, Any]]:
    with Table.open(path) as t:
        return sorted(t.to_arrow().to_pylist(), key=lambda r: r["k"])


def test_batch_writer_reserves_values_in_its_tasks(spark: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    Table.create(path, SCHEMA, data=pa.table({"k": [0]})).close()
    df = spark.range(1, 41).selectExpr("id AS k").repartition(4)
    df.write.format("eventlog").mode("append").save(path)
    rows = _rows(path)
    ids = [r["id"] for r in rows]
    assert [r["k"] for r in rows] == list(range(41)) and rows[0]["id"] == 5
    assert len(set(ids)) == 41 and all((i - 5) % 10 == 0 for i in ids)
    with Table.open(path) as t:
        info = t.history(1)[0]
    ranges = info["eventlog.identity"]["id"]
    assert len(ranges) == 4  # one reservation per task: values allocated in the tasks
    assert sum((last - first) // 10 + 1 for first, last in ranges) == 40
    assert _mark(path) == max(ids)
    with Table.open(path) as t:  # the engine's next value (from this process's block) is new
        t.append(pa.table({"k": [100]}))
    after = _rows(path)[-1]["id"]
    assert after not in ids and (after - 5) % 10 == 0
    assert _mark(path) == max(ids)  # a value below the mark never lowers it


def test_batch_writer_refuses_supplied_always_values_before_any_task(spark: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    Table.create(path, SCHEMA).close()
    with pytest.raises(SPARK_ERRORS) as err:
        spark.range(3).selectExpr("id", "id AS k").write.format("eventlog").mode("append").save(path)
    typed = recover_error(err.value)
    assert isinstance(typed, IdentityColumnError)
    assert (typed.column, typed.reason) == ("id", "explicit insert")
    with Table.open(path) as t:
        assert t.refresh().version == 0


def test_streaming_sink_reserves_values_in_its_tasks(spark: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    Table.create(path, SCHEMA).close()
    source = tmp_path / "in"
    source.mkdir()
    for i, ks in enumerate(([1, 2, 3], [4, 5])):
        pq.write_table(pa.table({"k": pa.array(ks, pa.int64())}), tmp_path / f".{i}")
        os.replace(tmp_path / f".{i}", source / f"{i}.parquet")
        query = (
            spark.readStream.schema("k LONG")
            .parquet(str(source))
            .writeStream.format("eventlog")
            .option("checkpointLocation", str(tmp_path / "cp"))
            .trigger(availableNow=True)
            .start(path)
        )
        try:
            assert query.awaitTermination(120)
        finally:
            query.stop()
    rows = _rows(path)
    assert [r["k"] for r in rows] == [1, 2, 3, 4, 5]
    ids = [r["id"] for r in rows]
    assert len(set(ids)) == 5 and all((i - 5) % 10 == 0 for i in ids)
    assert _mark(path) == max(ids)
    with Table.open(path) as t:
        assert all("eventlog.identity" in h for h in t.history() if h["operation"] == "STREAMING UPDATE")


def test_dml_refuses_identity_assignments_and_merge_inserts_it_cannot_generate(
    spark: Any, tmp_path: Path
) -> None:
    path = str(tmp_path / "t")
    Table.create(path, SCHEMA, data=pa.table({"k": [1, 2]})).close()
    handle = EventlogTable.forPath(spark, path)
    with pytest.raises(IdentityColumnError) as err:
        handle.update("k = 1", {"id": "id + 1"})
    assert (err.value.column, err.value.reason, err.value.operation) == ("id", "update", "UPDATE")
    source = spark.createDataFrame([(2,), (3,)], "k LONG")
    with pytest.raises(IdentityColumnError) as err:
        handle.alias("t").merge(source.alias("s"), "t.k = s.k").whenNotMatchedInsertAll().execute()
    assert (err.value.reason, err.value.operation) == ("not supported", "MERGE")
    handle.update("k = 1", {"k": "10"})  # other columns update; values stay
    assert _rows(path) == [{"id": 15, "k": 2}, {"id": 5, "k": 10}]
