"""Row tracking through Spark: appends get fresh row ids, DELETE/UPDATE/MERGE (Spark jobs)
keep each row's stable id, and the ``rowIds`` read option returns them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException

from eventlog import Table
from eventlog.files import row_tracking as rt
from spark_adapter.table import EventlogTable
from tests.conftest import SCHEMA, rows
from tests.spark.test_streaming_sink import Pipeline

pytestmark = pytest.mark.spark

ON = {"delta.enableRowTracking": "true"}
SPARK_ERRORS = (PySparkException, Py4JJavaError)


def _engine_ids(uri: str) -> dict[int, tuple[int, int]]:
    t = Table.open(uri).to_arrow(row_ids=True)
    got = dict(
        zip(
            t.column("id").to_pylist(),
            zip(t.column("_row_id").to_pylist(), t.column("_row_commit_version").to_pylist(), strict=True),
            strict=True,
        )
    )
    assert len({i for i, _ in got.values()}) == len(got)
    return got


def _spark_ids(spark: Any, uri: str) -> dict[int, tuple[int, int]]:
    df = spark.read.format("eventlog").option("rowIds", "true").load(uri)
    assert df.columns[-2:] == ["_row_id", "_row_commit_version"]
    return {r["id"]: (r["_row_id"], r["_row_commit_version"]) for r in df.collect()}


@pytest.mark.parametrize("dv", [False, True], ids=["rewrite", "dv"])
def test_spark_dml_keeps_stable_row_ids(spark: Any, tmp_path: Path, dv: bool) -> None:
    uri = str(tmp_path / "t")
    props = {**ON, "delta.enableDeletionVectors": str(dv).lower()}
    Table.create(uri, SCHEMA, partition_by=["date"], properties=props).close()
    df = spark.createDataFrame(pa.concat_tables([rows([1, 2, 3], "a"), rows([4, 5, 6], "b")]).to_pandas())
    df.write.format("eventlog").mode("append").save(uri)  # v1: fresh ids from Spark's append
    before = _engine_ids(uri)
    assert sorted(i for i, _ in before.values()) == list(range(6))
    assert _spark_ids(spark, uri) == before
    st = EventlogTable.forPath(spark, uri)
    st.delete("id = 2")  # v2
    st.update("id = 4", {"x": "x + 100"})  # v3
    source = spark.createDataFrame(rows([5, 6, 9], "b").to_pandas()).alias("s")
    (
        st.alias("t")
        .merge(source, "t.id = s.id")
        .whenMatchedUpdate("t.id = 5", set={"x": "s.x + 1000"})
        .whenMatchedDelete()
        .whenNotMatchedInsertAll()
        .execute()
    )  # v4
    after = _engine_ids(uri)
    assert set(after) == {1, 3, 4, 5, 9}
    for key in (1, 3):  # copied (or untouched): same id, same version
        assert after[key] == before[key]
    assert after[4] == (before[4][0], 3)  # updated: same id, the update's version
    assert after[5] == (before[5][0], 4)
    assert after[9][0] > max(i for i, _ in before.values()) and after[9][1] == 4  # inserted: fresh
    assert _spark_ids(spark, uri) == after
    assert Table.open(uri).verify().ok


def test_spark_appends_and_row_ids_read_filtered(spark: Any, tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    Table.create(uri, SCHEMA, properties=ON).close()
    for ids in ([1, 2], [3, 4, 5]):
        spark.createDataFrame(rows(ids).to_pandas()).write.format("eventlog").mode("append").save(uri)
    df = spark.read.format("eventlog").option("rowIds", "true").load(uri)
    got = sorted((r["id"], r["_row_id"], r["_row_commit_version"]) for r in df.where("id > 1").collect())
    ids = _engine_ids(uri)
    assert got == sorted((k, *ids[k]) for k in (2, 3, 4, 5))
    assert rt.high_water_mark(Table.open(uri).snapshot().domains) == 4


def test_row_ids_of_a_table_without_row_tracking_are_refused(spark: Any, tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    Table.create(uri, SCHEMA).append(rows([1]))
    with pytest.raises(SPARK_ERRORS, match="row tracking is not enabled"):
        spark.read.format("eventlog").option("rowIds", "true").load(uri).collect()


def test_streaming_sink_batches_get_fresh_row_ids(spark: Any, tmp_path: Path) -> None:
    pipeline = Pipeline(spark, tmp_path)
    Table.create(pipeline.uri, pa.schema([("id", pa.int64()), ("part", pa.int64())]), properties=ON).close()
    for start in (0, 10, 20):
        pipeline.add_file(list(range(start, start + 4)))
    pipeline.run()
    assert len(pipeline.batches()) == 3
    t = Table.open(pipeline.uri)
    adds = sorted(t.snapshot().add_files, key=lambda a: a.base_row_id or 0)
    assert all(a.base_row_id is not None for a in adds)
    assert {a.default_row_commit_version for a in adds} == {1, 2, 3}  # each batch's version
    got = _engine_ids(pipeline.uri)
    assert sorted(i for i, _ in got.values()) == list(range(12))
    assert rt.high_water_mark(t.snapshot().domains) == 11
