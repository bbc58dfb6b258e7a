"""spark_adapter.sql on a Spark Connect session: the statements run as on a classic one
(tests/spark/test_sql.py), checked against the Python API on identical tables."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from eventlog import Table
from spark_adapter.errors import UnsupportedStatementError
from spark_adapter.sql import sql
from tests.conftest import SCHEMA, rows

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]


def _pair(tmp_path: Path, properties: dict[str, str] | None = None) -> tuple[Table, Table]:
    out = []
    for name in ("sql", "api"):
        t = Table.create(str(tmp_path / name), SCHEMA, partition_by=["date"], properties=properties)
        t.append(rows([1, 2, 3], "2024-01-01"))
        t.append(rows([4, 5], "2024-01-02"))
        out.append(t)
    return out[0], out[1]


def _same(a: Table, b: Table) -> None:
    key = lambda r: (r["id"], r["date"])  # noqa: E731
    assert sorted(a.to_arrow().to_pylist(), key=key) == sorted(b.to_arrow().to_pylist(), key=key)
    assert a.version == b.version


@pytest.mark.parametrize("dv", [False, True])
def test_dml_on_connect_matches_the_python_api(connect_spark: Any, tmp_path: Path, dv: bool) -> None:
    spark = connect_spark
    ours, ref = _pair(tmp_path, {"delta.enableDeletionVectors": str(dv).lower()})
    p = ours.uri
    assert sql(spark, f"DELETE FROM eventlog.`{p}` WHERE id = 2").collect()[0][0] == 1
    ref.delete("id = 2")
    assert sql(spark, f"UPDATE eventlog.`{p}` SET x = x + 100 WHERE date = '2024-01-02'").collect()[0][0] == 2
    ref.update("date = '2024-01-02'", {"x": "x + 100"})
    sql(spark, f"INSERT INTO eventlog.`{p}` VALUES (6, '2024-01-03', 6, 0.5)")
    ref.append(pa.table({"id": [6], "date": ["2024-01-03"], "x": [6], "y": [0.5]}, schema=SCHEMA))
    view = f"src_{uuid.uuid4().hex[:8]}"
    spark.createDataFrame(rows([1, 7], "2024-01-01", x=70).to_pandas()).createOrReplaceTempView(view)
    counts = sql(
        spark,
        f"MERGE INTO eventlog.`{p}` AS t USING {view} AS s ON t.id = s.id AND t.date = s.date "
        "WHEN MATCHED THEN UPDATE SET x = s.x WHEN NOT MATCHED THEN INSERT *",
    ).collect()[0]
    assert tuple(counts) == (2, 1, 0, 1)
    ref.merge(
        rows([1, 7], "2024-01-01", x=70), "target.id = source.id AND target.date = source.date"
    ).when_matched_update(None, {"x": "source.x"}).when_not_matched_insert_all().execute()
    _same(ours, ref)
    old = sql(spark, f"SELECT id FROM eventlog.`{p}` VERSION AS OF 1 ORDER BY id").collect()
    assert [r[0] for r in old] == [1, 2, 3]


def test_maintenance_and_names_on_connect(connect_spark: Any, tmp_path: Path) -> None:
    spark = connect_spark
    ours, _ = _pair(tmp_path)
    p = ours.uri
    sql(spark, f"ALTER TABLE eventlog.`{p}` SET TBLPROPERTIES ('delta.isolationLevel' = 'Serializable')")
    assert ours.properties["delta.isolationLevel"] == "Serializable"
    out = sql(spark, f"OPTIMIZE eventlog.`{p}`").collect()[0]
    assert out["metrics"]["numFilesRemoved"] == 0  # one file per partition already
    assert [h["operation"] for h in sql(spark, f"DESCRIBE HISTORY eventlog.`{p}` LIMIT 2").collect()] == [
        "OPTIMIZE",
        "SET TBLPROPERTIES",
    ]
    name = f"connect_{uuid.uuid4().hex[:8]}"
    loc = str(tmp_path / "named")
    sql(spark, f"CREATE TABLE {name} (id BIGINT, kind STRING) USING eventlog LOCATION '{loc}'")
    sql(spark, f"INSERT INTO {name} VALUES (1, 'a')")
    assert spark.sql(f"SELECT count(*) FROM {name}").collect()[0][0] == 1  # Spark's own SQL, via the view
    assert Table.open(loc).version == 1
    sql(spark, f"DROP TABLE {name}")
    with pytest.raises(UnsupportedStatementError):
        sql(spark, f"UPDATE eventlog.`{p}` SET x = 1 FROM other")


def test_definitions_and_restore_on_connect(connect_spark: Any, tmp_path: Path) -> None:
    spark = connect_spark
    loc = str(tmp_path / "defs")
    sql(
        spark,
        f"CREATE TABLE eventlog.`{loc}` (id BIGINT NOT NULL, kind STRING) USING eventlog "
        "PARTITIONED BY (kind) TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')",
    )
    t = Table.open(loc)
    assert t.partition_columns == ("kind",) and not t.schema.field("id").nullable
    sql(spark, f"INSERT INTO eventlog.`{loc}` VALUES (1, 'a'), (2, 'a'), (3, 'b')")
    sql(spark, f"ALTER TABLE eventlog.`{loc}` ADD COLUMNS (note STRING)")
    sql(spark, f"ALTER TABLE eventlog.`{loc}` ADD CONSTRAINT positive CHECK (id > 0)")
    sql(spark, f"DELETE FROM eventlog.`{loc}` WHERE id = 2")
    purged = sql(spark, f"REORG TABLE eventlog.`{loc}` APPLY (PURGE)").collect()[0]
    assert purged["path"] == loc
    assert all(a.deletion_vector is None for a in Table.open(loc).snapshot().add_files)
    assert sql(spark, f"VACUUM eventlog.`{loc}` RETAIN 168 HOURS DRY RUN").collect() == []
    restored = sql(spark, f"RESTORE TABLE eventlog.`{loc}` TO VERSION AS OF 1").collect()[0]
    t = Table.open(loc)
    assert restored["num_of_files_after_restore"] == len(t.snapshot().add_files)
    assert sorted(t.to_arrow().column("id").to_pylist()) == [1, 2, 3]
    detail = sql(spark, f"DESCRIBE DETAIL eventlog.`{loc}`").collect()[0]
    assert (detail["location"], detail["partitionColumns"]) == (loc, ["kind"])
    assert "deletionVectors" in detail["tableFeatures"]
