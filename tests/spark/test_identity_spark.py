"""Identity columns on Spark: the batch writer and the streaming sink reserve values inside
the tasks (one range per task and column, recorded in the commit), never collide with the
engine's values, and refuse supplied ``GENERATED ALWAYS`` values; EventlogTable's MERGE
generates the values of inserted rows in its tasks the same way; UPDATE and MERGE refuse
setting an identity column (``UPDATE SET *`` included, as Delta)."""

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


def test_dml_refuses_identity_assignments(spark: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    Table.create(path, SCHEMA, data=pa.table({"k": [1, 2]})).close()
    handle = EventlogTable.forPath(spark, path)
    with pytest.raises(IdentityColumnError) as err:
        handle.update("k = 1", {"id": "id + 1"})
    assert (err.value.column, err.value.reason, err.value.operation) == ("id", "update", "UPDATE")
    # Delta: UPDATE SET * with a source that has the identity column is an update of it
    # (DELTA_IDENTITY_COLUMNS_UPDATE_NOT_SUPPORTED), and INSERT * of an ALWAYS column an
    # explicit insert; both before any job runs.
    with_id = spark.createDataFrame([(99, 2)], "id LONG, k LONG")
    with pytest.raises(IdentityColumnError) as err:
        handle.alias("t").merge(with_id.alias("s"), "t.k = s.k").whenMatchedUpdateAll().execute()
    assert (err.value.column, err.value.reason, err.value.operation) == ("id", "update", "MERGE")
    with pytest.raises(IdentityColumnError) as err:
        handle.alias("t").merge(with_id.alias("s"), "t.k = s.k").whenNotMatchedInsertAll().execute()
    assert (err.value.column, err.value.reason, err.value.operation) == ("id", "explicit insert", "MERGE")
    handle.update("k = 1", {"k": "10"})  # other columns update; values stay
    assert _rows(path) == [{"id": 15, "k": 2}, {"id": 5, "k": 10}]
    with Table.open(path) as t:
        assert t.refresh().version == 1


def test_merge_generates_identity_values_in_its_tasks(spark: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    Table.create(path, SCHEMA, data=pa.table({"k": [1, 2, 3]})).close()
    before = {r["k"]: r["id"] for r in _rows(path)}
    mark = _mark(path)
    assert mark == max(before.values())
    handle = EventlogTable.forPath(spark, path)
    source = spark.createDataFrame([(k, k * 1000) for k in range(2, 42)], "k LONG, v LONG").repartition(4)
    result = (
        handle.alias("t")
        .merge(source.alias("s"), "t.k = s.k")
        .whenMatchedUpdate(set={"k": "s.v"})  # k 2, 3 -> 2000, 3000: their ids stay
        .whenNotMatchedInsert(values={"k": "s.k"})  # id left to be generated
        .execute()
    )
    rows = _rows(path)
    by_k = {r["k"]: r["id"] for r in rows}
    assert sorted(by_k) == sorted([1, 2000, 3000, *range(4, 42)])
    assert (by_k[1], by_k[2000], by_k[3000]) == (before[1], before[2], before[3])
    new = [by_k[k] for k in range(4, 42)]
    ids = list(by_k.values())
    assert len(set(ids)) == len(ids) == 41
    assert all(i > mark and (i - 5) % 10 == 0 for i in new)  # above the previous mark, in step
    assert _mark(path) == max(ids)  # the log's mark moved past every value
    with Table.open(path) as t:
        info = t.history(1)[0]
    assert info["version"] == result.version and info["operation"] == "MERGE"
    ranges = info["eventlog.identity"]["id"]
    assert sum((last - first) // 10 + 1 for first, last in ranges) == 38
    assert sorted(v for first, last in ranges for v in range(first, last + 1, 10)) == sorted(new)
    assert info["tags"]["delta.identity.schemaUpdate"] == "true"
    assert info["operationMetrics"]["numTargetRowsInserted"] in (38, "38")


def test_merge_insert_all_generates_values_beside_a_concurrent_engine_append(
    spark: Any, tmp_path: Path
) -> None:
    path = str(tmp_path / "t")
    Table.create(path, SCHEMA, data=pa.table({"k": [0]})).close()
    handle = EventlogTable.forPath(spark, path)
    source = spark.createDataFrame([(k,) for k in range(1, 21)], "k LONG")
    pending = handle.alias("t").merge(source.alias("s"), "t.k = s.k").whenNotMatchedInsertAll().plan()
    with Table.open(path) as t:  # commits while the MERGE's files wait for its commit
        t.append(pa.table({"k": [100, 101]}))
    pending.commit()
    rows = _rows(path)
    assert [r["k"] for r in rows] == [0, *range(1, 21), 100, 101]
    ids = [r["id"] for r in rows]
    assert len(set(ids)) == len(ids) and all((i - 5) % 10 == 0 for i in ids)
    assert _mark(path) == max(ids)
    with Table.open(path) as t:
        assert [h["operation"] for h in t.history()][:2] == ["MERGE", "WRITE"]


def test_merge_generates_only_for_the_insert_clauses_that_leave_a_by_default_column_out(
    spark: Any, tmp_path: Path
) -> None:
    path = str(tmp_path / "t")
    schema = pa.schema([identity_field("id", start=1000, always=False), ("k", pa.int64())])
    Table.create(path, schema, data=pa.table({"k": [0]})).close()
    source = spark.createDataFrame([(k,) for k in range(1, 7)], "k LONG")
    (
        EventlogTable.forPath(spark, path)
        .alias("t")
        .merge(source.alias("s"), "t.k = s.k")
        .whenNotMatchedInsert("s.k <= 2", values={"id": "s.k", "k": "s.k"})  # supplied: kept
        .whenNotMatchedInsert(values={"k": "s.k"})  # generated in the tasks
        .execute()
    )
    by_k = {r["k"]: r["id"] for r in _rows(path)}
    assert (by_k[0], by_k[1], by_k[2]) == (1000, 1, 2)
    generated = sorted(by_k[k] for k in range(3, 7))
    assert len(set(generated)) == 4 and generated[0] > 1000
    assert _mark(path) == generated[-1]  # supplied values do not move the mark
    with Table.open(path) as t:
        ranges = t.history(1)[0]["eventlog.identity"]["id"]
    assert sorted(v for first, last in ranges for v in range(first, last + 1)) == generated


def test_a_handle_built_on_a_table_reserves_in_the_table_s_slot_store(spark: Any, tmp_path: Path) -> None:
    """``EventlogTable(spark, table)``: the tasks reserve identity values in the store the table
    was opened with (its spec), never in another one, whose counter would not know them."""
    path, slots = str(tmp_path / "t"), str(tmp_path / "slots")
    Table.create(path, SCHEMA, slots=slots, data=pa.table({"k": [0]})).close()
    with Table.open(path, slots) as table:
        assert table.slots_spec == slots
        handle = EventlogTable(spark, table)
        source = spark.createDataFrame([(k,) for k in range(1, 6)], "k LONG")
        handle.alias("t").merge(source.alias("s"), "t.k = s.k").whenNotMatchedInsertAll().execute()
    ids = [r["id"] for r in _rows(path)]
    assert len(set(ids)) == 6
    counters = [
        os.path.join(root, name)
        for root, _dirs, names in os.walk(tmp_path)
        for name in names
        if os.sep + "_counters" + os.sep in root + os.sep and not name.endswith(".lock")
    ]
    # Only the named store counted (the tasks' reservations included): nothing in the
    # table's embedded store, which the tasks would have used without the spec.
    assert counters and all(c.startswith(slots + os.sep) for c in counters)
