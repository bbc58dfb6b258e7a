"""EventlogTable on a Spark Connect session: DELETE, UPDATE, MERGE (with and without deletion
vectors), OPTIMIZE, VACUUM and history, each checked against the plain-Python operation on
an identical table (same rows, same version, same commit), as tests/spark/test_table_api.py
does on the classic session."""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pytest

from eventlog import Table
from eventlog.log.filetable import add_files
from eventlog.ops.vacuum import RETENTION_CHECK_CONF
from spark_adapter.table import EventlogTable
from tests.conftest import SCHEMA, rows

# 300 s: the first test also waits for the Connect server to start.
pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

SOURCE_DDL = "id BIGINT, date STRING, x BIGINT, y DOUBLE"
DV = {"delta.enableDeletionVectors": "true"}
Twins = Callable[..., tuple[Table, Table]]


def _build(uri: str, properties: dict[str, str] | None = None) -> Table:
    """Three appends (three files, two partitions) with the standard test schema."""
    t = Table.create(uri, SCHEMA, partition_by=["date"], properties=properties)
    t.append(rows(list(range(0, 10)), "2024-01-01"))
    t.append(rows(list(range(10, 20)), "2024-01-02"))
    t.append(rows(list(range(20, 25)), "2024-01-01"))
    return t


@pytest.fixture
def twins(tmp_path: Path) -> Twins:
    """(plain eventlog Table, identical Table the Connect side changes)."""
    made = iter(range(100))

    def make(properties: dict[str, str] | None = None) -> tuple[Table, Table]:
        n = next(made)
        plain = _build(str(tmp_path / f"plain{n}"), properties)
        return plain, _build(str(tmp_path / f"spark{n}"), properties)

    return make


def _rows(t: Table) -> list[dict[str, Any]]:
    return sorted(t.to_arrow().to_pylist(), key=lambda r: (r["id"], r["date"], r["x"]))


def _last(t: Table) -> dict[str, Any]:
    h = t.history(1)[0]
    return {k: h.get(k) for k in ("operation", "operationParameters", "operationMetrics")}


_LAYOUT_METRICS = ("numRemovedFiles", "numCopiedRows", "numTargetFilesRemoved", "numAddedFiles")


def _same(plain: Table, other: Table) -> None:
    """Same rows, same version, same last operation and parameters; metrics but those that
    depend on the file layout (Spark tasks write their own files)."""
    assert other.refresh().version == plain.refresh().version
    assert _rows(other) == _rows(plain)
    a, b = _last(plain), _last(other)
    for m in _LAYOUT_METRICS:
        a["operationMetrics"].pop(m, None)
        b["operationMetrics"].pop(m, None)
    assert b == a


def _has_dv(t: Table) -> bool:
    return any(a.deletion_vector is not None for a in add_files(t.refresh().select_files(None)[1]))


def test_session_helpers_on_connect(connect_spark: Any) -> None:
    from pyspark.sql import functions as F
    from pyspark.sql.types import IntegerType, StringType, StructField, StructType

    from spark_adapter.session import default_parallelism, is_connect, job_description, spread

    assert is_connect(connect_spark)
    assert default_parallelism(connect_spark) == 2  # local[2]
    schema = StructType([StructField("fid", IntegerType()), StructField("payload", StringType())])
    records = [(i, str(i)) for i in range(7)]
    # One record per task, as sparkContext.parallelize(records, len(records)) gives.
    df = spread(connect_spark, records, schema, len(records))
    parts = df.select("fid", F.spark_partition_id().alias("p")).collect()
    assert sorted(r.fid for r in parts) == list(range(7))
    assert sorted(r.p for r in parts) == list(range(7))
    with job_description(connect_spark, "eventlog DELETE /tmp/x, y"):
        assert connect_spark.getTags() == {"eventlog_DELETE_/tmp/x_y"}
    assert connect_spark.getTags() == set()


@pytest.mark.parametrize("props", [None, DV], ids=["rewrite", "dv"])
def test_delete_update_match_plain(connect_spark: Any, twins: Twins, props: dict[str, str] | None) -> None:
    from pyspark.sql import functions as F

    plain, other = twins(props)
    st = EventlogTable.forPath(connect_spark, other.uri)
    plain.delete("x % 3 = 0")
    assert st.delete("x % 3 = 0").version == 4
    _same(plain, other)
    assert _has_dv(other) == (props is not None)
    plain.update("id > 15", set={"x": "x + 100", "y": "y * 2"})
    assert st.update("id > 15", set={"x": "x + 100", "y": "y * 2"}).version == 5
    _same(plain, other)
    # A Column condition: its SQL is rendered from the Connect expression, so the read
    # predicate (here partition-only: whole files removed unread) and the recorded
    # predicate are the plain operation's.
    plain.delete("(date = '2024-01-02')")
    assert st.delete(F.col("date") == "2024-01-02").version == 6
    _same(plain, other)
    assert _last(other)["operationParameters"]["predicate"] == "[\"(date = '2024-01-02')\"]"
    assert _last(other)["operationMetrics"] == _last(plain)["operationMetrics"]
    plain.update("(x > 110)", set={"x": "x - 1"})
    assert st.update(F.col("x") > 110, set={"x": F.col("x") - 1}).version == 7
    _same(plain, other)


@pytest.mark.parametrize("props", [None, DV], ids=["rewrite", "dv"])
def test_merge_matches_plain(connect_spark: Any, twins: Twins, props: dict[str, str] | None) -> None:
    plain, other = twins(props)
    data = [
        (1, "2024-01-01", -1, 0.0),  # matched, deleted (s.x < 0)
        (2, "2024-01-01", 200, 2.5),  # matched, updated
        (12, "2024-01-02", 1200, 12.5),  # matched, updated
        (21, "2024-01-01", 2100, 21.5),  # matched (second file), updated
        (100, "2024-01-03", 5, 100.0),  # inserted
        (101, "2024-01-02", -5, 101.0),  # not inserted (clause condition)
    ]
    arrow = pa.Table.from_pylist([dict(zip(SCHEMA.names, r, strict=True)) for r in data], schema=SCHEMA)
    on = "t.id = s.id AND t.date = s.date"
    (
        plain.merge(arrow, on, source_alias="s", target_alias="t")
        .when_matched_delete("s.x < 0")
        .when_matched_update(set={"x": "s.x", "y": "t.y + s.y"})
        .when_not_matched_insert_all("s.x > 0")
        .execute()
    )
    src = connect_spark.createDataFrame(data, SOURCE_DDL).alias("s")
    result = (
        EventlogTable.forPath(connect_spark, other.uri)
        .alias("t")
        .merge(src, on)
        .whenMatchedDelete("s.x < 0")
        .whenMatchedUpdate(set={"x": "s.x", "y": "t.y + s.y"})
        .whenNotMatchedInsertAll("s.x > 0")
        .execute()
    )
    assert result.version == 4
    _same(plain, other)
    assert _last(other)["operationMetrics"]["numTargetRowsUpdated"] == "3"
    assert _last(other)["operationMetrics"]["numTargetRowsInserted"] == "1"
    assert _has_dv(other) == (props is not None)


def test_optimize_and_history(connect_spark: Any, twins: Twins) -> None:
    plain, other = twins()
    st = EventlogTable.forPath(connect_spark, other.uri)
    plain.optimize()
    assert st.optimize().executeCompaction().version == 4
    _same(plain, other)
    assert len(other.files()) == 2  # one file per partition
    assert st.optimize().where("date = '2024-01-01'").executeZOrderBy("x", "y").version == 5
    assert _rows(other) == _rows(plain)
    hist = st.history().collect()
    assert [r.version for r in hist] == [5, 4, 3, 2, 1, 0]
    assert [r.operation for r in hist][:2] == ["OPTIMIZE", "OPTIMIZE"]
    assert [h["operation"] for h in other.history()] == [r.operation for r in hist]
    assert hist[1].operationParameters == {
        k: str(v) for k, v in plain.history(1)[0]["operationParameters"].items()
    }
    assert [r.version for r in st.history(2).collect()] == [5, 4]
    assert st.toDF().count() == 25


def _backdate(path: Path, hours: float) -> None:
    old = time.time() - hours * 3600
    os.utime(path, (old, old))


def test_vacuum(connect_spark: Any, tmp_path: Path) -> None:
    t = _build(str(tmp_path / "t"))
    st = EventlogTable.forPath(connect_spark, t.uri)
    root = Path(t.uri)
    st.delete("date = '2024-01-02'")
    removed = next(p for p in root.glob("date=2024-01-02/*.parquet"))
    orphan_old = root / "date=2024-01-01" / "part-orphan-old.parquet"
    orphan_new = root / "date=2024-01-01" / "part-orphan-new.parquet"
    orphan_old.write_bytes(b"x")
    orphan_new.write_bytes(b"x")
    for p in root.rglob("*"):
        if p.is_file() and p != orphan_new:
            _backdate(p, 200)
    live = {root / a for a in t.files()}
    assert st.vacuum(dryRun=True) == [str(orphan_old)] and orphan_old.exists()
    assert st.vacuum() == [str(orphan_old)]
    assert not orphan_old.exists() and removed.exists() and orphan_new.exists()
    connect_spark.conf.set(RETENTION_CHECK_CONF, "false")
    try:
        deleted = st.vacuum(0)
    finally:
        connect_spark.conf.unset(RETENTION_CHECK_CONF)
    assert sorted(deleted) == sorted([str(removed), str(orphan_new)])
    assert all(p.exists() for p in live)
    assert sorted(t.to_arrow().column("id").to_pylist()) == [*range(10), *range(20, 25)]


CLUSTER_SCHEMA = pa.schema([("id", pa.int64()), ("k", pa.int64()), ("v", pa.string())])


def _unclustered_batch(seed: int, n: int = 200) -> pa.Table:
    rng = np.random.default_rng(seed)
    ids = rng.permutation(10_000)[:n].astype(np.int64) + seed * 10_000
    keys = rng.integers(0, 1_000, n).astype(np.int64)
    return pa.table({"id": ids, "k": keys, "v": [f"v{i % 7}" for i in ids]}, schema=CLUSTER_SCHEMA)


@pytest.mark.parametrize("target", [None, "6000"], ids=["one-group", "shuffled"])
def test_clustered_optimize(connect_spark: Any, tmp_path: Path, target: str | None) -> None:
    """Clustering OPTIMIZE: one group (one task, the engine's order) and several groups (the
    sampled, shuffled plan: DataFrame jobs on Connect)."""
    props = {"delta.targetFileSize": target} if target else None
    tables = []
    for name in ("plain", "spark"):
        t = Table.create(str(tmp_path / name), CLUSTER_SCHEMA, properties=props, cluster_by=["k"])
        for seed in range(8):
            t.append(_unclustered_batch(seed))
        tables.append(t)
    plain, other = tables
    plain.optimize()
    result = EventlogTable.forPath(connect_spark, other.uri).optimize().executeCompaction()
    assert result.version == plain.refresh().version == 9
    assert result.metrics["numRemovedFiles"] == "8"
    assert _last(other)["operation"] == _last(plain)["operation"] == "OPTIMIZE"
    assert _last(other)["operationParameters"] == _last(plain)["operationParameters"]
    key = sorted(plain.to_arrow().to_pylist(), key=lambda r: r["id"])
    assert sorted(other.to_arrow().to_pylist(), key=lambda r: r["id"]) == key
    files = other.refresh().add_files
    assert {f.clustering_provider for f in files} == {"liquid"}
    if target is None:
        assert len(files) == 1
        return
    assert len(files) >= 3
    ranges = sorted(
        (orjson.loads(f.stats or "{}")["minValues"]["k"], orjson.loads(f.stats or "{}")["maxValues"]["k"])
        for f in files
    )
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(ranges))  # clustered along k


def test_merge_with_column_condition_and_values(connect_spark: Any, twins: Twins) -> None:
    """Column conditions and SET values (Connect expressions), the source alias read from the
    Connect plan."""
    from pyspark.sql import functions as F

    plain, other = twins(DV)
    data = [(2, "2024-01-01", 200, 2.5), (12, "2024-01-02", 1200, 12.5), (300, "2024-01-04", 3, 3.0)]
    arrow = pa.Table.from_pylist([dict(zip(SCHEMA.names, r, strict=True)) for r in data], schema=SCHEMA)
    plain.merge(arrow, "(t.id = s.id)", source_alias="s", target_alias="t").when_matched_update(
        set={"x": "s.x + 1"}
    ).when_not_matched_insert_all().execute()
    src = connect_spark.createDataFrame(data, SOURCE_DDL).alias("s")
    (
        EventlogTable.forPath(connect_spark, other.uri)
        .alias("t")
        .merge(src, F.col("t.id") == F.col("s.id"))
        .whenMatchedUpdate(set={"x": F.col("s.x") + 1})
        .whenNotMatchedInsertAll()
        .execute()
    )
    _same(plain, other)
    assert _has_dv(other)


def test_change_feed_read(connect_spark: Any, tmp_path: Path) -> None:
    t = Table.create(str(tmp_path / "t"), SCHEMA, properties={"delta.enableChangeDataFeed": "true"})
    t.append(rows([1, 2, 3]))
    EventlogTable.forPath(connect_spark, t.uri).update("id = 2", set={"x": "20"})
    EventlogTable.forPath(connect_spark, t.uri).delete("id = 3")
    df = connect_spark.read.format("eventlog").option("readChangeFeed", "true").option("startingVersion", 1)
    got = sorted((r.id, r.x, r._change_type, r._commit_version) for r in df.load(t.uri).collect())
    expected = sorted(
        (r["id"], r["x"], r["_change_type"], r["_commit_version"]) for r in t.changes(1).to_pylist()
    )
    assert got == expected
    assert got == [
        (1, 1, "insert", 1),
        (2, 2, "insert", 1),
        (2, 2, "update_preimage", 2),
        (2, 20, "update_postimage", 2),
        (3, 3, "delete", 3),
        (3, 3, "insert", 1),
    ]
