"""spark_adapter.sql: SQL statements on eventlog tables, compared with the Python API on the
same table (classic session)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from eventlog import ConstraintViolationError, Table
from eventlog.errors import TableAlreadyExistsError
from spark_adapter.errors import UnsupportedStatementError
from spark_adapter.sql import install, refresh, sql, uninstall
from spark_adapter.sql.grammar import parse_maintenance
from tests.conftest import SCHEMA, rows

pytestmark = pytest.mark.spark


def _ids(t: Table, **kw: Any) -> list[int]:
    return sorted(t.to_arrow(**kw).column("id").to_pylist())


def _rows(df: Any) -> list[tuple[Any, ...]]:
    return sorted(tuple(r) for r in df.collect())


@pytest.fixture
def table(tmp_path: Path) -> Table:
    t = Table.create(str(tmp_path / "t"), SCHEMA, partition_by=["date"])
    t.append(rows([1, 2, 3], "2024-01-01"))
    t.append(rows([4, 5], "2024-01-02"))
    return t


def test_select_with_time_travel_joins_and_filters(spark: Any, table: Table) -> None:
    p = table.uri
    assert _rows(sql(spark, f"SELECT id FROM eventlog.`{p}` WHERE x > 2")) == [(3,), (4,), (5,)]
    assert _rows(sql(spark, f"SELECT id FROM eventlog.`{p}` VERSION AS OF 1")) == [(1,), (2,), (3,)]
    stamp = table.history()[-1]["timestamp"]  # version 0
    got = sql(spark, f"SELECT count(*) FROM delta.`{p}` TIMESTAMP AS OF '{_iso(stamp)}'").collect()[0][0]
    assert got == table.to_arrow(version=table.version_at(stamp)).num_rows
    joined = sql(
        spark,
        f"SELECT a.id, b.id FROM eventlog.`{p}` a JOIN eventlog.`{p}` VERSION AS OF 1 b ON a.id = b.id + 1",
    )
    assert _rows(joined) == [(2, 1), (3, 2), (4, 3)]


def _iso(ms: int) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")


def test_insert_values_query_column_list_and_replace_where(spark: Any, table: Table) -> None:
    p = table.uri
    sql(spark, f"INSERT INTO eventlog.`{p}` VALUES (6, '2024-01-03', 6, 0.5)")
    sql(spark, f"INSERT INTO eventlog.`{p}` (id, date) VALUES (7, '2024-01-03')")
    got = {r["id"]: r for r in table.to_arrow().to_pylist()}
    assert got[6]["x"] == 6 and got[7]["x"] is None
    sql(spark, f"INSERT INTO eventlog.`{p}` SELECT id + 10, date, x, y FROM eventlog.`{p}` WHERE id < 3")
    assert _ids(table) == [1, 2, 3, 4, 5, 6, 7, 11, 12]
    sql(
        spark,
        f"INSERT INTO eventlog.`{p}` REPLACE WHERE date = '2024-01-03' "
        "SELECT 8 AS id, '2024-01-03' AS date, 8 AS x, 0.0 AS y",
    )
    assert _ids(table, filter="date = '2024-01-03'") == [8]
    before = table.version
    sql(spark, f"INSERT OVERWRITE eventlog.`{p}` SELECT * FROM eventlog.`{p}` VERSION AS OF 1")
    assert _ids(table) == [1, 2, 3] and table.version == before + 1
    with pytest.raises(UnsupportedStatementError) as err:
        sql(spark, f"INSERT INTO eventlog.`{p}` VALUES (1, 'x')")
    assert "4 columns" in err.value.reason and table.version == before + 1


@pytest.mark.parametrize("dv", [False, True])
def test_delete_update_merge_match_the_python_api(spark: Any, tmp_path: Path, dv: bool) -> None:
    props = {"delta.enableDeletionVectors": str(dv).lower()}
    ours = Table.create(str(tmp_path / "sql"), SCHEMA, properties=props)
    ref = Table.create(str(tmp_path / "api"), SCHEMA, properties=props)
    for t in (ours, ref):
        t.append(rows([1, 2, 3, 4, 5]))
    p = ours.uri
    assert sql(spark, f"DELETE FROM eventlog.`{p}` WHERE id = 2").collect()[0][0] == 1
    ref.delete("id = 2")
    n = sql(spark, f"UPDATE eventlog.`{p}` AS t SET x = t.x * 10, y = 1.5 WHERE t.id > 3").collect()[0][0]
    assert n == 2
    ref.update("id > 3", {"x": "x * 10", "y": "1.5"})
    spark.createDataFrame(rows([3, 5, 9], x=100).to_pandas()).createOrReplaceTempView("changes")
    merged = sql(
        spark,
        f"""MERGE INTO eventlog.`{p}` AS t USING changes AS s ON t.id = s.id
        WHEN MATCHED AND s.id = 5 THEN DELETE
        WHEN MATCHED THEN UPDATE SET x = s.x
        WHEN NOT MATCHED THEN INSERT *""",
    ).collect()[0]
    assert tuple(merged) == (3, 1, 1, 1)
    (
        ref.merge(rows([3, 5, 9], x=100), "target.id = source.id")
        .when_matched_delete("source.id = 5")
        .when_matched_update(None, {"x": "source.x"})
        .when_not_matched_insert_all()
        .execute()
    )
    assert ours.to_arrow().sort_by("id").to_pylist() == ref.to_arrow().sort_by("id").to_pylist()
    assert [h["operation"] for h in ours.history()][:3] == ["MERGE", "UPDATE", "DELETE"]


def test_merge_insert_values_and_update_set_star(spark: Any, table: Table) -> None:
    p = table.uri
    spark.createDataFrame(rows([1, 9], "2024-01-02", x=50).to_pandas()).createOrReplaceTempView("src")
    sql(
        spark,
        f"""MERGE INTO eventlog.`{p}` t USING (SELECT * FROM src WHERE x = 50) s ON t.id = s.id
        WHEN MATCHED THEN UPDATE SET *
        WHEN NOT MATCHED BY TARGET AND s.id > 5 THEN INSERT (id, date, x) VALUES (s.id, s.date, -1)""",
    )
    got = {r["id"]: (r["date"], r["x"]) for r in table.to_arrow().to_pylist()}
    assert got[1] == ("2024-01-02", 50) and got[9] == ("2024-01-02", -1)
    with pytest.raises(UnsupportedStatementError) as err:
        sql(
            spark,
            f"MERGE INTO eventlog.`{p}` t USING src s ON t.id = s.id "
            "WHEN NOT MATCHED BY SOURCE THEN UPDATE SET *",
        )
    assert "BY SOURCE" in err.value.reason


@pytest.mark.parametrize("dv", [False, True])
def test_merge_not_matched_by_source_matches_the_engine(spark: Any, tmp_path: Path, dv: bool) -> None:
    props = {"delta.enableDeletionVectors": str(dv).lower(), "delta.enableChangeDataFeed": "true"}
    ours = Table.create(str(tmp_path / "sql"), SCHEMA, partition_by=["date"], properties=props)
    ref = Table.create(str(tmp_path / "api"), SCHEMA, partition_by=["date"], properties=props)
    for t in (ours, ref):
        t.append(rows([1, 2, 3], "2024-01-01"))
        t.append(rows([4, 5, 6], "2024-01-02"))
    source = rows([2, 5, 9], "2024-01-02", x=0)
    spark.createDataFrame(source.to_pandas()).createOrReplaceTempView("state")
    counts = sql(
        spark,
        f"""MERGE INTO eventlog.`{ours.uri}` t USING state s ON t.id = s.id AND t.date = s.date
        WHEN MATCHED THEN UPDATE SET x = s.x
        WHEN NOT MATCHED THEN INSERT *
        WHEN NOT MATCHED BY SOURCE AND t.date = '2024-01-01' THEN UPDATE SET x = -t.x
        WHEN NOT MATCHED BY SOURCE THEN DELETE""",
    ).collect()[0]
    result = (
        ref.merge(source, "t.id = s.id AND t.date = s.date", source_alias="s", target_alias="t")
        .when_matched_update(None, {"x": "s.x"})
        .when_not_matched_insert_all()
        .when_not_matched_by_source_update("t.date = '2024-01-01'", {"x": "-t.x"})
        .when_not_matched_by_source_delete()
        .execute()
    )
    m = {k: int(v) for k, v in result.metrics.items()}
    assert tuple(counts) == (
        m["numTargetRowsUpdated"] + m["numTargetRowsDeleted"] + m["numTargetRowsInserted"],
        m["numTargetRowsUpdated"], m["numTargetRowsDeleted"], m["numTargetRowsInserted"],
    )  # fmt: skip
    assert ours.to_arrow().sort_by("id").to_pylist() == ref.to_arrow().sort_by("id").to_pylist()
    info = ours.history(1)[0]
    assert info["operationMetrics"] == {k: str(v) for k, v in m.items()}
    by_source = ref.history(1)[0]["operationParameters"]["notMatchedBySourcePredicates"]
    assert info["operationParameters"]["notMatchedBySourcePredicates"] == by_source
    key = lambda r: (r["id"], r["_change_type"])  # noqa: E731
    assert sorted(ours.changes(2).drop_columns(["_commit_timestamp"]).to_pylist(), key=key) == sorted(
        ref.changes(2).drop_columns(["_commit_timestamp"]).to_pylist(), key=key
    )


def test_maintenance_statements(spark: Any, table: Table) -> None:
    p = table.uri
    table.append(rows([6], "2024-01-01"))
    out = sql(spark, f"OPTIMIZE eventlog.`{p}` WHERE date = '2024-01-01' ZORDER BY (x)").collect()[0]
    assert out["path"] == p and out["metrics"]["numFilesRemoved"] == 2
    assert table.history()[0]["operation"] == "OPTIMIZE"
    hist = sql(spark, f"DESCRIBE HISTORY eventlog.`{p}` LIMIT 2").collect()
    assert [h["operation"] for h in hist] == ["OPTIMIZE", "WRITE"]
    detail = sql(spark, f"DESCRIBE DETAIL eventlog.`{p}`").collect()[0]
    assert (detail["format"], detail["location"], detail["partitionColumns"]) == ("delta", p, ["date"])
    assert detail["numFiles"] == len(table.snapshot().add_files)
    version = table.version
    restored = sql(spark, f"RESTORE TABLE eventlog.`{p}` TO VERSION AS OF 1").collect()[0]
    assert restored["num_of_files_after_restore"] == len(table.snapshot().add_files)
    assert _ids(table) == [1, 2, 3] and table.version == version + 1
    assert sql(spark, f"VACUUM eventlog.`{p}` RETAIN 168 HOURS DRY RUN").collect() == []


def test_alter_table_statements_from_the_isolation_documents(spark: Any, table: Table) -> None:
    p = table.uri
    sql(spark, f"ALTER TABLE eventlog.`{p}` SET TBLPROPERTIES ('delta.isolationLevel' = 'Serializable')")
    assert table.properties["delta.isolationLevel"] == "Serializable"
    props = dict(_rows(sql(spark, f"SHOW TBLPROPERTIES eventlog.`{p}`")))
    assert props["delta.isolationLevel"] == "Serializable"
    sql(spark, f"ALTER TABLE eventlog.`{p}` UNSET TBLPROPERTIES IF EXISTS ('delta.isolationLevel', 'nope')")
    assert "delta.isolationLevel" not in table.properties
    sql(spark, f"ALTER TABLE eventlog.`{p}` SET TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')")
    sql(spark, f"DELETE FROM eventlog.`{p}` WHERE id = 1")
    sql(spark, f"REORG TABLE eventlog.`{p}` APPLY (PURGE)")
    assert all(a.deletion_vector is None for a in table.snapshot().add_files)
    sql(spark, f"ALTER TABLE eventlog.`{p}` DROP FEATURE deletionVectors")
    assert "deletionVectors" not in (table.snapshot().protocol.writer_features or ())
    sql(spark, f"ALTER TABLE eventlog.`{p}` ADD COLUMNS (note STRING COMMENT 'free text')")
    sql(spark, f"ALTER TABLE eventlog.`{p}` ADD CONSTRAINT positive CHECK (x > 0)")
    assert table.properties["delta.constraints.positive"] == "x > 0"
    with pytest.raises(ConstraintViolationError):
        sql(spark, f"INSERT INTO eventlog.`{p}` VALUES (99, '2024-01-05', -1, 0.0, NULL)")
    sql(spark, f"ALTER TABLE eventlog.`{p}` DROP CONSTRAINT positive")
    assert table.schema.names == ["id", "date", "x", "y", "note"]


def test_create_table_ctas_and_registered_names(spark: Any, tmp_path: Path, table: Table) -> None:
    loc = str(tmp_path / "created")
    name = f"sql_events_{uuid.uuid4().hex[:8]}"
    sql(
        spark,
        f"CREATE TABLE IF NOT EXISTS {name} (id BIGINT NOT NULL, kind STRING) USING eventlog "
        f"PARTITIONED BY (kind) LOCATION '{loc}' TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true')",
    )
    created = Table.open(loc)
    assert created.partition_columns == ("kind",)
    assert created.properties["delta.enableChangeDataFeed"] == "true"
    assert not created.schema.field("id").nullable
    sql(spark, f"INSERT INTO {name} VALUES (1, 'a'), (2, 'b')")
    sql(spark, f"UPDATE {name} SET kind = 'c' WHERE id = 2")
    assert _rows(sql(spark, f"SELECT id, kind FROM {name}")) == [(1, "a"), (2, "c")]
    sql(spark, f"CREATE TABLE IF NOT EXISTS {name} (id BIGINT) USING eventlog LOCATION '{loc}'")  # no-op
    assert Table.open(loc).version == 2
    sql(spark, f"DROP TABLE {name}")  # the name goes, the table stays
    assert Table.open(loc).version == 2
    with pytest.raises(UnsupportedStatementError):  # a name Spark does not know is Spark's error
        sql(spark, f"DELETE FROM eventlog.`{loc}` USING x WHERE id = 1")
    ctas = str(tmp_path / "ctas")
    sql(spark, f"CREATE TABLE eventlog.`{ctas}` USING eventlog AS SELECT id, x FROM eventlog.`{table.uri}`")
    assert _ids(Table.open(ctas)) == [1, 2, 3, 4, 5]
    with pytest.raises(TableAlreadyExistsError):
        sql(spark, f"CREATE TABLE eventlog.`{ctas}` USING eventlog AS SELECT 1 AS id")
    # Other statements are Spark's.
    assert sql(spark, "SELECT 1 + 1").collect()[0][0] == 2


def test_install_makes_it_the_sessions_sql(spark: Any, table: Table) -> None:
    install(spark)
    try:
        assert spark.sql(f"DELETE FROM eventlog.`{table.uri}` WHERE id = 5").collect()[0][0] == 1
        assert spark.sql("SELECT 2").collect()[0][0] == 2
    finally:
        uninstall(spark)
    assert _ids(table) == [1, 2, 3, 4]


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("OPTIMIZE t ZORDER", "unexpected text"),
        ("REORG TABLE t APPLY (UPGRADE UNIFORM ICEBERG)", "only APPLY (PURGE)"),
        ("VACUUM t RETAIN HOURS", "expected the retention"),
        ("RESTORE TABLE t TO VERSION AS OF 'x'", "expected a version"),
        ("DESCRIBE HISTORY t LIMIT x", "expected a row count"),
    ],
)
def test_bad_maintenance_statements_name_what_is_wrong(text: str, reason: str) -> None:
    with pytest.raises(UnsupportedStatementError) as err:
        parse_maintenance(text)
    assert reason in err.value.reason and err.value.statement == text


def test_a_statement_that_cannot_run_writes_nothing(spark: Any, table: Table) -> None:
    version = table.version
    with pytest.raises(UnsupportedStatementError):
        sql(spark, f"DELETE FROM eventlog.`{table.uri}` USING other WHERE id = 1")
    with pytest.raises(UnsupportedStatementError):
        sql(spark, f"UPDATE eventlog.`{table.uri}` SET x = 1 FROM other")
    assert table.version == version


def test_plain_spark_sql_reads_a_name_through_a_view_that_stays_current(spark: Any, tmp_path: Path) -> None:
    name = f"tracked_{uuid.uuid4().hex[:8]}"
    loc = str(tmp_path / "named")
    sql(spark, f"CREATE TABLE {name} (id BIGINT) USING eventlog LOCATION '{loc}'")
    sql(spark, f"INSERT INTO {name} VALUES (1), (2)")
    original = spark.sql  # Spark's own: not installed here
    assert original(f"SELECT count(*) FROM {name}").first()[0] == 2
    Table.open(loc).append(pa.table({"id": [3]}))  # a write outside SQL: seen after a refresh
    refresh(spark)
    assert original(f"SELECT count(*) FROM {name}").first()[0] == 3
    sql(spark, f"DELETE FROM {name} WHERE id = 3")  # a statement on the name refreshes its view
    assert original(f"SELECT count(*) FROM {name}").first()[0] == 2
    sql(spark, f"ALTER TABLE {name} ADD COLUMNS (note STRING)")  # the view takes the new column
    sql(spark, f"INSERT INTO {name} VALUES (4, 'x')")
    assert _rows(original(f"SELECT id, note FROM {name} WHERE note IS NOT NULL")) == [(4, "x")]
    sql(spark, f"DROP TABLE {name}")
    assert name not in [t.name for t in spark.catalog.listTables()]


def test_column_mapping_and_clustering_statements_match_the_python_api(spark: Any, tmp_path: Path) -> None:
    ours, ref = str(tmp_path / "sql"), str(tmp_path / "api")
    mapping = {"delta.columnMapping.mode": "name"}
    sql(
        spark,
        f"CREATE TABLE eventlog.`{ours}` (id BIGINT, kind STRING, x BIGINT, y DOUBLE) USING eventlog "
        "CLUSTER BY (kind) TBLPROPERTIES ('delta.columnMapping.mode' = 'name')",
    )
    schema = pa.schema([("id", pa.int64()), ("kind", pa.string()), ("x", pa.int64()), ("y", pa.float64())])
    api = Table.create(ref, schema, properties=mapping, cluster_by=["kind"])
    assert Table.open(ours).clustering_columns() == api.clustering_columns() == ["kind"]
    data = pa.table({"id": [1, 2, 3], "kind": ["a", "b", "a"], "x": [10, 20, 30], "y": [1.0, 2.0, 3.0]})
    values = "(1, 'a', 10, 1.0), (2, 'b', 20, 2.0), (3, 'a', 30, 3.0)"
    sql(spark, f"INSERT INTO eventlog.`{ours}` VALUES {values}")
    api.append(data)
    sql(spark, f"ALTER TABLE eventlog.`{ours}` RENAME COLUMN x TO amount")
    api.rename_column("x", "amount")
    sql(spark, f"ALTER TABLE eventlog.`{ours}` DROP COLUMN y")
    api.drop_columns(["y"])
    sql(spark, f"ALTER TABLE eventlog.`{ours}` CLUSTER BY (amount, kind)")
    api.cluster_by(["amount", "kind"])
    got = Table.open(ours)
    assert got.schema == api.schema and got.schema.names == ["id", "kind", "amount"]
    assert got.clustering_columns() == api.clustering_columns() == ["amount", "kind"]
    selected = sql(spark, f"SELECT id, amount FROM eventlog.`{ours}` WHERE kind = 'a'")
    assert _rows(selected) == [(1, 10), (3, 30)]
    sql(spark, f"ALTER TABLE eventlog.`{ours}` DROP COLUMNS IF EXISTS (nope, y)")  # nothing to drop
    assert Table.open(ours).version == api.version
    sql(spark, f"ALTER TABLE eventlog.`{ours}` CLUSTER BY NONE")
    assert Table.open(ours).clustering_columns() == []
    assert got.version == api.version + 1
