"""Column mapping both ways against Delta Spark.

Delta Spark's column-mapped tables (``name`` and ``id`` modes, partitioned, with deletion
vectors, after RENAME COLUMN, nested and partition renames, and DROP COLUMN) are read by us
with Delta Spark's rows and schema at every version, and written by us (append, DELETE,
UPDATE, MERGE, OPTIMIZE), then read back by Delta Spark with the same rows. Tables where we
turned mapping on and renamed or dropped columns are read by Delta Spark with our rows and
schema, written by it, and read back by us.
"""

from __future__ import annotations

import glob
import os
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from eventlog import Table
from eventlog.files import column_mapping as cm
from tests.deltaspark.peer import delta_arrow, delta_detail, delta_history, same_rows, schema_shape

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]


def _sql(spark: Any, path: str, *statements: str) -> None:
    for s in statements:
        spark.sql(s.format(t=f"delta.`{path}`"))


def _delta_table(spark: Any, path: str, mode: str) -> None:
    _sql(
        spark,
        path,
        "CREATE TABLE {t} (id BIGINT, p STRING, s STRUCT<a: INT, b: STRING>, v STRING, w INT) USING delta"
        f" PARTITIONED BY (p) TBLPROPERTIES ('delta.columnMapping.mode' = '{mode}',"
        " 'delta.enableDeletionVectors' = 'true')",
        "INSERT INTO {t} VALUES (1, 'x', named_struct('a', 1, 'b', 'q'), 'one', 10),"
        " (2, 'y', NULL, 'two', 20), (3, 'x', named_struct('a', 3, 'b', NULL), 'three', 30),"
        " (4, 'y', named_struct('a', 4, 'b', 'r'), 'four', 40)",
        "ALTER TABLE {t} RENAME COLUMN v TO v2",
        "ALTER TABLE {t} RENAME COLUMN s.a TO a2",
        "ALTER TABLE {t} RENAME COLUMN p TO part",
        "DELETE FROM {t} WHERE id = 2",  # a deletion vector
        "ALTER TABLE {t} DROP COLUMN w",
        "INSERT INTO {t} VALUES (5, 'z', named_struct('a2', 5, 'b', 'e'), 'five')",
        "ALTER TABLE {t} ADD COLUMNS (w INT)",  # the dropped name again: a new column
        "INSERT INTO {t} VALUES (6, 'x', NULL, 'six', 60)",
    )


def _compare(ours: pa.Table, theirs: pa.Table) -> list[str]:
    wrong = []
    if schema_shape(ours.schema) != schema_shape(theirs.schema):
        wrong.append(f"schema: ours {schema_shape(ours.schema)} theirs {schema_shape(theirs.schema)}")
    else:
        got, want = same_rows(ours, theirs)
        if got != want:
            wrong.append(f"rows: ours {got} theirs {want}")
    return wrong


@pytest.mark.parametrize("mode", ["name", "id"])
def test_we_read_and_write_delta_spark_mapped_tables(spark: Any, tmp_path: Path, mode: str) -> None:
    path = str(tmp_path / "t")
    _delta_table(spark, path, mode)
    latest = delta_history(spark, path)[0][0]
    table = Table.open(path)
    wrong = []
    for version in range(latest + 1):
        wrong += [
            f"v{version} {w}"
            for w in _compare(table.to_arrow(version=version), delta_arrow(spark, path, version))
        ]
    assert not wrong, "\n".join(wrong)
    final = table.to_arrow().sort_by("id").to_pylist()
    assert [(r["id"], r["part"], r["v2"], r["w"]) for r in final] == [
        (1, "x", "one", None), (3, "x", "three", None), (4, "y", "four", None), (5, "z", "five", None),
        (6, "x", "six", 60),
    ]  # fmt: skip
    assert final[0]["s"] == {"a2": 1, "b": "q"}
    # A filter on a renamed nested field and on the renamed partition column.
    assert [r["id"] for r in table.to_arrow(filter="s.a2 >= 3 AND part = 'x'").to_pylist()] == [3]

    # Our writes on a copy: append, DELETE, UPDATE, MERGE, OPTIMIZE; Delta Spark reads them.
    copy = str(tmp_path / "copy")
    shutil.copytree(path, copy)
    ours = Table.open(copy)
    ours.append(pa.table({"id": [7], "part": ["y"], "v2": ["seven"], "w": pa.array([70], pa.int32())}))
    ours.delete("id = 1")
    ours.update("id = 3", {"v2": "'THREE'", "w": "33"})
    src = pa.table({"id": [4, 8], "part": ["y", "z"], "v2": ["FOUR", "eight"]})
    (
        ours.merge(src, "t.id = s.id", source_alias="s", target_alias="t")
        .when_matched_update(set={"v2": "s.v2"})
        .when_not_matched_insert_all()
        .execute()
    )
    ours.optimize()
    expected = [
        (3, "x", "THREE", 33), (4, "y", "FOUR", None), (5, "z", "five", None), (6, "x", "six", 60),
        (7, "y", "seven", 70), (8, "z", "eight", None),
    ]  # fmt: skip
    theirs = delta_arrow(spark, copy)
    assert _compare(ours.to_arrow(), theirs) == []
    assert [
        (r["id"], r["part"], r["v2"], r["w"]) for r in ours.to_arrow().sort_by("id").to_pylist()
    ] == expected
    ops = [op for _, op in delta_history(spark, copy)[:5]]
    assert ops == ["OPTIMIZE", "MERGE", "UPDATE", "DELETE", "WRITE"]
    # Our files: physical names only, in random-prefix directories like Delta's.
    part_key = cm.physical_name(ours.schema.field("part"))
    for add in ours.snapshot().add_files:
        assert set(add.partition_values) == {part_key}
        assert "=" not in add.path.split("/")[0]


def test_delta_spark_reads_and_writes_tables_we_mapped(spark: Any, tmp_path: Path) -> None:
    # Created with mapping on (col-<uuid> names), and one where we turned it on later.
    created = str(tmp_path / "created")
    enabled = str(tmp_path / "enabled")
    data = pa.table(
        {
            "id": pa.array([1, 2, 3], pa.int64()),
            "p": ["x", "y", "x"],
            "s": [{"a": 1, "b": "q"}, None, {"a": 3, "b": "r"}],
            "v": ["one", "two", "three"],
        }
    )
    Table.create(created, data=data, partition_by=["p"], properties={"delta.columnMapping.mode": "name"})
    late = Table.create(
        enabled, data=data, partition_by=["p"], properties={"delta.enableDeletionVectors": "true"}
    )
    late.set_properties({"delta.columnMapping.mode": "name"})
    for path in (created, enabled):
        t = Table.open(path)
        t.rename_column("v", "v2")
        t.rename_column("s.a", "a2")
        t.rename_column("p", "part")
        t.drop_columns(["s.b"])
        t.delete("id = 2")
        detail = delta_detail(spark, path)
        assert "columnMapping" in detail["tableFeatures"]
        assert _compare(t.to_arrow(), delta_arrow(spark, path)) == []
        for version in range(t.version + 1):
            assert _compare(t.to_arrow(version=version), delta_arrow(spark, path, version)) == [], version
        # Delta Spark writes on: INSERT, UPDATE, DELETE, RENAME and DROP; we read its commits.
        _sql(
            spark,
            path,
            "INSERT INTO {t} VALUES (4, 'y', named_struct('a2', 4), 'four')",
            "UPDATE {t} SET v2 = 'ONE' WHERE id = 1",
            "DELETE FROM {t} WHERE id = 3",
            "ALTER TABLE {t} RENAME COLUMN v2 TO v3",
            "ALTER TABLE {t} DROP COLUMN s",
            "INSERT INTO {t} VALUES (5, 'z', 'five')",
        )
        after = Table.open(path)
        assert _compare(after.to_arrow(), delta_arrow(spark, path)) == []
        assert after.to_arrow().sort_by("id").to_pylist() == [
            {"id": 1, "part": "x", "v3": "ONE"},
            {"id": 4, "part": "y", "v3": "four"},
            {"id": 5, "part": "z", "v3": "five"},
        ]
    # The table we turned mapping on kept its Hive-style directories for its first files.
    first = {os.path.relpath(p, enabled).split("/")[0] for p in glob.glob(f"{enabled}/*/*.parquet")}
    assert {"p=x", "p=y"} <= first
