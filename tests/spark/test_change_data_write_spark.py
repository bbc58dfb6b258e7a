"""Change data feed and Spark writes: the batch writer's appends and overwrites, and DELETE,
UPDATE and MERGE in Spark jobs, record their changes as the engine does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from eventlog import Table
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


@pytest.mark.parametrize("dv", [False, True], ids=["rewrite", "dv"])
def test_spark_delete_and_update_write_change_data(spark: Any, tmp_path: Path, dv: bool) -> None:
    """In Spark jobs as in the engine: the changed rows in change files (a DELETE on a DV
    table is left to the DVs); new images with their generated columns computed again."""
    uri = str(tmp_path / "t")
    schema = pa.schema([*SCHEMA, pa.field("w", pa.int64(), metadata={"delta.generationExpression": "v * 2"})])
    props = {**CDF, "delta.enableDeletionVectors": str(dv).lower()}
    t = Table.create(uri, schema, properties=props)
    t.append(pa.table({"id": [1, 2, 3], "v": [10, 20, 30]}))
    handle = EventlogTable.forPath(spark, uri)
    handle.delete("id = 1")  # v2
    handle.update("id = 3", {"v": "v + 1"})  # v3
    assert [bool(_cdc(uri, v)) for v in (2, 3)] == [not dv, True]
    assert _changes(uri, 2) == [
        (2, "delete", 1, 10), (3, "update_postimage", 3, 31), (3, "update_preimage", 3, 30),
    ]  # fmt: skip
    post = pa.table(DeltaTable(uri).load_cdf(starting_version=3).read_all()).to_pylist()
    assert sorted((r["_change_type"], r["w"]) for r in post) == [
        ("update_postimage", 62),
        ("update_preimage", 60),
    ]
    t.refresh()
    assert sorted(t.to_arrow().column("id").to_pylist()) == [2, 3]
    assert t.verify().ok


def _cdc(uri: str, version: int) -> list[Any]:
    text = (Path(uri) / "_delta_log" / f"{version:020d}.json").read_text()
    return [line for line in text.splitlines() if line.startswith('{"cdc"')]


@pytest.mark.parametrize("dv", [False, True], ids=["rewrite", "dv"])
def test_spark_merge_writes_change_data(spark: Any, tmp_path: Path, dv: bool) -> None:
    """Old images and deletes from the target's rows, new images and inserts as the write
    tasks wrote them (identity values included); a MERGE that only inserts, or on a DV
    table only deletes, leaves its changes to the file actions."""
    uri = str(tmp_path / "t")
    identity = {
        "delta.identity.start": "100",
        "delta.identity.step": "1",
        "delta.identity.allowExplicitInsert": "false",
    }
    schema = pa.schema([*SCHEMA, pa.field("n", pa.int64(), metadata=identity)])
    t = Table.create(uri, schema, properties={**CDF, "delta.enableDeletionVectors": str(dv).lower()})
    t.append(pa.table({"id": [1, 2, 3], "v": [10, 20, 30]}))  # n = 100, 101, 102
    handle = EventlogTable.forPath(spark, uri)
    source = spark.createDataFrame(
        [(1, 11, False), (2, 0, True), (4, 40, False)], "id long, v long, gone boolean"
    )
    (
        handle.alias("t")
        .merge(source.alias("s"), "t.id = s.id")
        .whenMatchedDelete("s.gone")
        .whenMatchedUpdate(set={"v": "s.v"})
        .whenNotMatchedInsert(values={"id": "s.id", "v": "s.v"})
        .execute()
    )  # v2
    assert _cdc(uri, 2)
    rows = pa.table(DeltaTable(uri).load_cdf(starting_version=2).read_all()).to_pylist()
    t.refresh()
    live = {r["id"]: r["n"] for r in t.to_arrow().to_pylist()}
    assert live[4] > 102  # generated in the task (blocks: gaps are allowed)
    assert sorted((r["_change_type"], r["id"], r["v"], r["n"]) for r in rows) == [
        ("delete", 2, 20, 101), ("insert", 4, 40, live[4]),
        ("update_postimage", 1, 11, 100), ("update_preimage", 1, 10, 100),
    ]  # fmt: skip
    inserts = spark.createDataFrame([(9, 90, False)], "id long, v long, gone boolean")
    handle.alias("t").merge(inserts.alias("s"), "t.id = s.id").whenNotMatchedInsert(
        values={"id": "s.id", "v": "s.v"}
    ).execute()  # v3: inserts only
    assert not _cdc(uri, 3)
    assert [
        (r["_change_type"], r["id"])
        for r in pa.table(DeltaTable(uri).load_cdf(starting_version=3).read_all()).to_pylist()
    ] == [("insert", 9)]
    assert t.verify().ok
