"""Our change data, read by Delta Spark: its ``table_changes`` over the commits our DELETE,
UPDATE, MERGE and overwrite wrote (change files where a change is row-level, inferred from
adds and removes elsewhere) gives exactly the changes, with and without deletion vectors,
partitioned or not and with column mapping; and Delta Spark's own DML continues the feed
on our table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from eventlog import Table
from tests.support.change_data import delete_update_merge

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("p", pa.string()), pa.field("v", pa.int64())])


def _delta_changes(spark: Any, path: str, start: int) -> list[tuple[int, str, int, str, int]]:
    rows = spark.sql(f"SELECT * FROM table_changes_by_path('{path}', {start})").collect()
    return sorted((r._commit_version, r._change_type, r.id, r.p, r.v) for r in rows)


def _our_history(t: Table) -> None:
    t.append(pa.table({"id": [1, 2, 3, 4], "p": ["a", "a", "b", "b"], "v": [10, 20, 30, 40]}, schema=SCHEMA))
    delete_update_merge(t)  # v2, v3, v4
    t.delete("p = 'b'")  # v5: whole files
    t.overwrite(pa.table({"id": [2], "p": ["a"], "v": [7]}, schema=SCHEMA), replace_where="id = 2")  # v6


EXPECTED = [
    (1, "insert", 1, "a", 10), (1, "insert", 2, "a", 20),
    (1, "insert", 3, "b", 30), (1, "insert", 4, "b", 40),
    (2, "delete", 1, "a", 10),
    (3, "update_postimage", 3, "b", 31), (3, "update_preimage", 3, "b", 30),
    (4, "delete", 4, "b", 40), (4, "insert", 5, "a", 500),
    (4, "update_postimage", 2, "a", 200), (4, "update_preimage", 2, "a", 20),
    (5, "delete", 3, "b", 31),
    (6, "delete", 2, "a", 200), (6, "insert", 2, "a", 7),
]  # fmt: skip


@pytest.mark.parametrize(
    "props",
    [
        {"delta.enableDeletionVectors": "false"},
        {"delta.enableDeletionVectors": "true"},
        {"delta.enableDeletionVectors": "true", "delta.columnMapping.mode": "name"},
    ],
    ids=["rewrite", "dv", "dv-mapped"],
)
@pytest.mark.parametrize("partitioned", [True, False], ids=["partitioned", "flat"])
def test_delta_spark_reads_our_change_data(
    spark: Any, tmp_path: Path, props: dict[str, str], partitioned: bool
) -> None:
    path = str(tmp_path / "t")
    properties = {"delta.enableChangeDataFeed": "true", **props}
    t = Table.create(path, SCHEMA, partition_by=["p"] if partitioned else None, properties=properties)
    _our_history(t)
    assert _delta_changes(spark, path, 1) == EXPECTED


def test_delta_spark_continues_the_feed_on_our_table(spark: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    props = {"delta.enableChangeDataFeed": "true", "delta.enableDeletionVectors": "true"}
    t = Table.create(path, SCHEMA, partition_by=["p"], properties=props)
    _our_history(t)
    spark.sql(f"UPDATE delta.`{path}` SET v = v * 10 WHERE id = 5")  # v7, its own change files
    t.refresh()
    t.delete("id = 5")  # v8, ours again
    assert _delta_changes(spark, path, 7) == [
        (7, "update_postimage", 5, "a", 5000), (7, "update_preimage", 5, "a", 500),
        (8, "delete", 5, "a", 5000),
    ]  # fmt: skip
