"""The change data feed read against Delta Spark: on tables Delta Spark writes with
``delta.enableChangeDataFeed`` (inserts, DELETE, UPDATE, MERGE, OPTIMIZE and RESTORE; with and
without deletion vectors; partitioned or not), ``Table.changes`` returns exactly Delta
Spark's ``table_changes`` rows, timestamps included; and Delta Spark's
``readChangeFeed`` read of a table our writer made returns exactly ours."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from eventlog import ChangeDataNotRecordedError, Table

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]


def _sql(spark: Any, path: str, *statements: str) -> None:
    for s in statements:
        spark.sql(s.format(t=f"delta.`{path}`"))


def _comparable(table: pa.Table, names: list[str]) -> list[dict[str, Any]]:
    """Rows in a canonical order; commit timestamps as UTC microseconds, strings plain."""
    cols = []
    for name in names:
        col = table.column(name)
        if name == "_commit_timestamp":
            col = pc.cast(pc.cast(col, pa.timestamp("us", tz="UTC")), pa.int64())
        elif pa.types.is_large_string(col.type) or pa.types.is_string_view(col.type):
            col = pc.cast(col, pa.string())
        cols.append(col)
    return sorted(pa.table(cols, names=names).to_pylist(), key=repr)


def _theirs(spark: Any, path: str, start: int, end: int | None = None) -> pa.Table:
    reader = spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", start)
    if end is not None:
        reader = reader.option("endingVersion", end)
    result: pa.Table = reader.load(path).toArrow()
    return result


SCENARIOS = {
    "plain": (False, False),
    "partitioned": (True, False),
    "deletion vectors": (False, True),
    "deletion vectors, partitioned": (True, True),
}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_we_read_delta_sparks_change_data_as_it_does(spark: Any, tmp_path: Path, scenario: str) -> None:
    partitioned, dvs = SCENARIOS[scenario]
    path = str(tmp_path / "t")
    _sql(
        spark,
        path,
        "CREATE TABLE {t} (id BIGINT, p STRING, v STRING) USING delta"
        + (" PARTITIONED BY (p)" if partitioned else "")
        + " TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true',"
        f" 'delta.enableDeletionVectors' = '{str(dvs).lower()}')",
        "INSERT INTO {t} VALUES (1, 'x', 'one'), (2, 'y', 'two'), (3, 'x', 'three'), (4, 'y', 'four')",
        "INSERT INTO {t} VALUES (5, 'x', 'five'), (6, 'y', 'six')",
        "DELETE FROM {t} WHERE id = 2",
        "UPDATE {t} SET v = 'THREE' WHERE id = 3",
        "MERGE INTO {t} AS t USING (SELECT 4 AS id, 'y' AS p, 'FOUR' AS v UNION ALL"
        " SELECT 7, 'x', 'seven' UNION ALL SELECT 5, 'x', 'gone') AS s ON t.id = s.id"
        " WHEN MATCHED AND s.v = 'gone' THEN DELETE"
        " WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *",
        "MERGE INTO {t} AS t USING (SELECT 1 AS id) AS s ON t.id = s.id AND s.id < 0"
        " WHEN MATCHED THEN DELETE",  # changes nothing
        "OPTIMIZE {t}",  # dataChange = false: no changes
        "RESTORE TABLE {t} TO VERSION AS OF 2",  # adds and removes without cdc actions
    )
    ours = Table.open(path).changes(0)
    theirs = _theirs(spark, path, 0)
    assert ours.column_names == theirs.column_names
    assert _comparable(ours, ours.column_names) == _comparable(theirs, ours.column_names)
    kinds = set(ours.column("_change_type").to_pylist())
    assert kinds == {"insert", "delete", "update_preimage", "update_postimage"}
    for start, end in ((3, 4), (5, 5), (7, None)):
        got = Table.open(path).changes(start, end)
        assert _comparable(got, got.column_names) == _comparable(
            _theirs(spark, path, start, end), got.column_names
        )


def test_table_changes_sql_and_timestamps_agree(spark: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    _sql(
        spark,
        path,
        "CREATE TABLE {t} (id BIGINT) USING delta TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true')",
        "INSERT INTO {t} VALUES (1), (2)",
        "DELETE FROM {t} WHERE id = 1",
    )
    theirs = spark.sql(f"SELECT * FROM table_changes_by_path('{path}', 1)").toArrow()
    ours = Table.open(path).changes(1)
    assert _comparable(ours, ours.column_names) == _comparable(theirs, ours.column_names)
    # Start by the second commit's timestamp: the same versions.
    start = ours.column("_commit_timestamp")[0].as_py()
    assert _comparable(Table.open(path).changes(start_timestamp=start), ours.column_names) == _comparable(
        ours, ours.column_names
    )


def test_change_data_not_recorded_as_delta(spark: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    _sql(
        spark,
        path,
        "CREATE TABLE {t} (id BIGINT) USING delta",
        "INSERT INTO {t} VALUES (1)",
        "ALTER TABLE {t} SET TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true')",
        "INSERT INTO {t} VALUES (2)",
    )
    with pytest.raises(Exception, match="DELTA_MISSING_CHANGE_DATA"):
        _theirs(spark, path, 1)
    with pytest.raises(ChangeDataNotRecordedError) as err:
        Table.open(path).changes(1)
    assert (err.value.version, err.value.start, err.value.end) == (1, 1, 3)
    ours = Table.open(path).changes(2)
    assert _comparable(ours, ours.column_names) == _comparable(_theirs(spark, path, 2), ours.column_names)


def test_delta_spark_reads_our_change_data_as_we_do(spark: Any, tmp_path: Path) -> None:
    data = pa.table({"id": pa.array([1, 2, 3, 4], pa.int64()), "p": ["a", "a", "b", "b"]})
    table = Table.create(
        str(tmp_path / "t"),
        data.schema,
        partition_by=["p"],
        properties={"delta.enableChangeDataFeed": "true"},
    )
    table.append(data)
    table.delete("id = 2")
    table.update("id = 3", {"id": "30"})
    table.append(pa.table({"id": pa.array([5], pa.int64()), "p": ["a"]}))
    ours = table.changes(1)
    theirs = _theirs(spark, table.uri, 1)
    assert _comparable(ours, ours.column_names) == _comparable(theirs, ours.column_names)
