"""Row tracking both ways with Delta Spark: its ``_metadata.row_id`` and
``_metadata.row_commit_version`` equal ours on tables we write (appends, rewrites, deletion
vectors, OPTIMIZE), and ours equal its on tables it writes; each engine keeps the other's
stable ids through its own UPDATE and MERGE."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from eventlog import Table
from eventlog.files import row_tracking as rt
from tests.deltaspark.peer import delta_detail

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.int64()), ("p", pa.string())])


def _rows(ids: list[int], p: str = "a") -> pa.Table:
    return pa.table({"id": ids, "v": [i * 10 for i in ids], "p": [p] * len(ids)}, schema=SCHEMA)


def ours(path: str) -> dict[int, tuple[int, int]]:
    t = Table.open(path).to_arrow(row_ids=True)
    return {
        i: (r, c)
        for i, r, c in zip(
            t.column("id").to_pylist(),
            t.column("_row_id").to_pylist(),
            t.column("_row_commit_version").to_pylist(),
            strict=True,
        )
    }


def theirs(spark: Any, path: str) -> dict[int, tuple[int, int]]:
    rows = spark.sql(
        f"SELECT id, _metadata.row_id AS r, _metadata.row_commit_version AS c FROM delta.`{path}`"
    ).collect()
    return {int(x.id): (int(x.r), int(x.c)) for x in rows}


@pytest.mark.parametrize(
    ("dv", "partitioned"), [(False, False), (True, True)], ids=["rewrite-flat", "dv-partitioned"]
)
def test_delta_spark_reads_our_row_ids_and_keeps_them(
    spark: Any, tmp_path: Path, dv: bool, partitioned: bool
) -> None:
    path = str(tmp_path / "t")
    props = {"delta.enableRowTracking": "true", "delta.enableDeletionVectors": str(dv).lower()}
    t = Table.create(path, SCHEMA, partition_by=["p"] if partitioned else None, properties=props)
    t.append(pa.concat_tables([_rows([1, 2, 3], "a"), _rows([4, 5], "b")]))
    t.append(_rows([6, 7], "b"))
    t.delete("id = 2")
    t.update("id = 4", {"v": "-4"})
    t.merge(_rows([5, 8], "b"), "target.id = source.id").when_matched_update(
        None, {"v": "-5"}
    ).when_not_matched_insert_all().execute()
    t.optimize()
    assert "rowTracking" in delta_detail(spark, path)["tableFeatures"]
    mine = ours(path)
    assert theirs(spark, path) == mine
    # Delta Spark updates our table: the rows keep the ids we gave them, the updated ones
    # take its commit's version; and we read what it wrote the same way it does.
    spark.sql(f"UPDATE delta.`{path}` SET v = v + 1 WHERE id IN (1, 6)")
    version = Table.open(path).version
    after = theirs(spark, path)
    assert {k: r for k, (r, _) in after.items()} == {k: r for k, (r, _) in mine.items()}
    assert {k: c for k, (_, c) in after.items() if k in (1, 6)} == {1: version, 6: version}
    assert ours(path) == after
    # Its high-water mark continues ours: our next append takes ids above everything.
    t.append(_rows([9], "a"))
    fresh = ours(path)[9][0]
    assert fresh > max(r for r, _ in after.values())
    assert theirs(spark, path) == ours(path)
    assert rt.high_water_mark(Table.open(path).snapshot().domains) >= fresh


def test_we_read_and_keep_the_row_ids_delta_spark_assigned(spark: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    spark.sql(
        f"CREATE TABLE delta.`{path}` (id BIGINT, v BIGINT, p STRING) USING delta "
        "TBLPROPERTIES ('delta.enableRowTracking' = 'true', 'delta.enableDeletionVectors' = 'false')"
    )
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (1, 10, 'a'), (2, 20, 'a'), (3, 30, 'b')")
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (4, 40, 'b')")
    spark.sql(f"UPDATE delta.`{path}` SET v = 0 WHERE id = 2")  # materializes ids in the rewrite
    before = theirs(spark, path)
    assert ours(path) == before
    t = Table.open(path)
    t.update("id = 3", {"v": "-3"})
    t.delete("id = 1")
    t.append(_rows([5], "a"))
    mine = ours(path)
    assert {k: r for k, (r, _) in mine.items() if k != 5} == {k: before[k][0] for k in (2, 3, 4)}
    assert mine[3][1] == t.version - 2 and mine[4] == before[4]
    assert mine[5][0] > max(r for r, _ in before.values())
    assert theirs(spark, path) == mine


def test_delta_spark_reads_ids_after_we_enable_row_tracking_on_an_existing_table(
    spark: Any, tmp_path: Path
) -> None:
    path = str(tmp_path / "t")
    t = Table.create(path, SCHEMA)
    t.append(_rows([1, 2]))
    t.append(_rows([3]))
    t.set_properties({"delta.enableRowTracking": "true"})
    t.update("id = 1", {"v": "-1"})
    assert theirs(spark, path) == ours(path)
    assert sorted(r for r, _ in ours(path).values()) == [0, 1, 2]
