"""REORG TABLE ... APPLY (PURGE) both ways with Delta Spark: it reads the tables we purged,
we purge its deletion-vector tables, and our purge of a copy of its table equals its own
``REORG TABLE ... APPLY (PURGE)`` of another copy (rows, deletion vectors gone, history)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from eventlog import Table
from tests.deltaspark.peer import delta_arrow, delta_history, same_rows

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

SCHEMA = pa.schema([("id", pa.int64()), ("date", pa.string()), ("x", pa.int64())])
A, B = "2024-01-01", "2024-01-02"


def _rows(ids: list[int], date: str) -> pa.Table:
    return pa.table({"id": ids, "date": [date] * len(ids), "x": [i * 10 for i in ids]}, schema=SCHEMA)


def _dv_files(path: str) -> list[dict[str, str]]:
    """Partition values of the live files that carry a deletion vector."""
    return [dict(a.partition_values) for a in Table.open(path).snapshot().add_files if a.deletion_vector]


def _last_commit(spark: Any, path: str) -> tuple[str, dict[str, str], dict[str, str]]:
    """Delta Spark's DESCRIBE HISTORY of the newest version: operation, parameters, metrics."""
    row = spark.sql(f"DESCRIBE HISTORY delta.`{path}` LIMIT 1").collect()[0]
    return str(row.operation), dict(row.operationParameters or {}), dict(row.operationMetrics or {})


def test_delta_spark_reads_our_purged_table(spark: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    t = Table.create(path, SCHEMA, partition_by=["date"], properties={"delta.enableDeletionVectors": "true"})
    t.append(pa.concat_tables([_rows([1, 2, 3], A), _rows([4, 5, 6], B)]))
    t.append(_rows([7, 8], A))
    t.delete("id IN (2, 5, 8)")
    assert len(_dv_files(path)) == 3
    result = t.reorg_purge()
    assert _dv_files(path) == []
    ours, theirs = same_rows(t.to_arrow(), delta_arrow(spark, path))
    assert ours == theirs and sorted(r["id"] for r in ours) == [1, 3, 4, 6, 7]
    # Delta Spark names our commit as it names its own REORG.
    assert delta_history(spark, path)[0] == (result.version, "REORG")
    operation, params, _ = _last_commit(spark, path)
    assert (operation, params) == ("REORG", {"predicate": "[]", "applyPurge": "true"})
    # ... and reads the versions before and after it alike.
    before, _ = same_rows(
        Table.open(path).to_arrow(version=result.version - 1), delta_arrow(spark, path, result.version - 1)
    )
    assert before == ours


@pytest.mark.parametrize("where", [None, f"date = '{B}'"], ids=["whole-table", "one-partition"])
def test_our_purge_of_a_delta_spark_table_equals_its_own(
    spark: Any, tmp_path: Path, where: str | None
) -> None:
    made = str(tmp_path / "made")
    table = f"delta.`{made}`"
    spark.sql(
        f"CREATE TABLE {table} (id BIGINT, date STRING, x BIGINT) USING delta PARTITIONED BY (date)"
        " TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')"
    )
    # One file per partition and append (coalesced), so each DELETE below leaves live rows.
    for ids, dates in (([1, 2, 3, 4, 5, 6], [A, A, A, B, B, B]), ([7, 8, 9], [A, A, B])):
        frame = spark.createDataFrame(
            [(i, d, i * 10) for i, d in zip(ids, dates, strict=True)], "id BIGINT, date STRING, x BIGINT"
        )
        frame.coalesce(1).write.format("delta").mode("append").save(made)
    spark.sql(f"DELETE FROM {table} WHERE id IN (2, 5)")  # a deletion vector in each partition
    assert sorted(d["date"] for d in _dv_files(made)) == [A, B]
    ours_path, theirs_path = str(tmp_path / "ours"), str(tmp_path / "theirs")
    shutil.copytree(made, ours_path)
    shutil.copytree(made, theirs_path)

    result = Table.open(ours_path).reorg_purge(where)
    clause = f" WHERE {where}" if where else ""
    spark.sql(f"REORG TABLE delta.`{theirs_path}`{clause} APPLY (PURGE)")

    # The same rows (read by both engines), the same files left with deletion vectors.
    ours, theirs = same_rows(Table.open(ours_path).to_arrow(), delta_arrow(spark, theirs_path))
    assert ours == theirs and sorted(r["id"] for r in ours) == [1, 3, 4, 6, 7, 8, 9]
    ours_spark, _ = same_rows(delta_arrow(spark, ours_path), delta_arrow(spark, theirs_path))
    assert ours_spark == theirs
    assert _dv_files(ours_path) == _dv_files(theirs_path) == ([] if where is None else [{"date": A}])
    # The same history entry: operation name, parameter names, files removed.
    op_ours, params_ours, metrics_ours = _last_commit(spark, ours_path)
    op_theirs, params_theirs, metrics_theirs = _last_commit(spark, theirs_path)
    assert op_ours == op_theirs == "REORG"
    assert params_ours.keys() == params_theirs.keys() == {"predicate", "applyPurge"}
    assert params_ours["applyPurge"] == params_theirs["applyPurge"] == "true"
    assert len(json.loads(params_ours["predicate"])) == len(json.loads(params_theirs["predicate"]))
    assert (
        metrics_ours["numRemovedFiles"] == metrics_theirs["numRemovedFiles"] == str(2 if where is None else 1)
    )
    assert metrics_ours["numDeletionVectorsRemoved"] == metrics_theirs["numDeletionVectorsRemoved"]
    assert result.operation == "REORG"
    # Delta Spark writes on after our purge, and we after its.
    spark.sql(f"INSERT INTO delta.`{ours_path}` VALUES (9, '{A}', 90)")
    Table.open(theirs_path).append(_rows([9], A))
    ours, theirs = same_rows(Table.open(ours_path).to_arrow(), delta_arrow(spark, theirs_path))
    assert ours == theirs and len(ours) == 8
