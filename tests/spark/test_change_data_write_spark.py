"""Change data feed and Spark writes: the batch writer's appends and overwrites, and DELETE
and UPDATE in Spark jobs, record their changes as the engine does; MERGE in Spark jobs,
which does not write change data yet, refuses a table with the feed on before writing
anything."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from eventlog import Table, UnsupportedProtocolError
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


def test_spark_merge_refuses_a_change_data_table_and_changes_nothing(spark: Any, tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    t = Table.create(uri, SCHEMA, properties=CDF)
    t.append(pa.table({"id": [1, 2], "v": [10, 20]}, schema=SCHEMA))
    handle = EventlogTable.forPath(spark, uri)
    source = spark.createDataFrame([(1, 5)], "id long, v long")
    with pytest.raises(UnsupportedProtocolError) as err:
        handle.alias("t").merge(source.alias("s"), "t.id = s.id").whenMatchedUpdate(
            set={"v": "s.v"}
        ).execute()
    assert err.value.features == ["changeDataFeed"]
    assert "Python API" in str(err.value)
    assert t.refresh().version == 1
    assert sorted(t.to_arrow().column("id").to_pylist()) == [1, 2]
    data_files = [p for p in Path(uri).rglob("*.parquet") if "_delta_log" not in p.parts]
    assert len(data_files) == 1  # the append's: nothing written by the refused MERGE
