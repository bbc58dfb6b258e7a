"""EventlogTable (spark_adapter.table): every Spark operation checked against the plain-Python
eventlog operation on an identical table, plus conflicts, deletion vectors, vacuum and cleanup."""

from __future__ import annotations

import glob
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from eventlog import ConcurrentAppendException, InvalidInputError, Table
from eventlog.errors import MergeCardinalityError
from eventlog.txn.transaction import dv_relative_path
from spark_adapter.native import NATIVE_CONF
from spark_adapter.table import RETENTION_CHECK_CONF, EventlogTable
from tests.conftest import SCHEMA, rows

pytestmark = pytest.mark.spark

SOURCE_DDL = "id BIGINT, date STRING, x BIGINT, y DOUBLE"
DV = {"delta.enableDeletionVectors": "true"}


def _build(uri: str, partition_by: list[str], properties: dict[str, str] | None = None) -> Table:
    """Three appends (three files, two partitions) with the standard test schema."""
    t = Table.create(uri, SCHEMA, partition_by=partition_by, properties=properties)
    t.append(rows(list(range(0, 10)), "2024-01-01"))
    t.append(rows(list(range(10, 20)), "2024-01-02"))
    t.append(rows(list(range(20, 25)), "2024-01-01"))
    return t


@pytest.fixture(params=["native", "python"])
def read_path(request: pytest.FixtureRequest, spark: Any) -> Iterator[str]:
    """Spark operations read their target natively (default) or in Python tasks."""
    spark.conf.set(NATIVE_CONF, str(request.param == "native").lower())
    try:
        yield str(request.param)
    finally:
        spark.conf.unset(NATIVE_CONF)


@pytest.fixture
def twins(tmp_path: Path, read_path: str) -> Callable[..., tuple[Table, Table]]:
    """A factory of two identical tables: (plain eventlog Table, Table the Spark side uses),
    for each read path of the Spark side."""
    made = iter(range(100))

    def make(
        partition_by: list[str] | None = None, properties: dict[str, str] | None = None
    ) -> tuple[Table, Table]:
        parts = ["date"] if partition_by is None else partition_by
        n = next(made)
        return (
            _build(str(tmp_path / f"plain{n}"), parts, properties),
            _build(str(tmp_path / f"spark{n}"), parts, properties),
        )

    return make


def _rows(t: Table) -> list[dict[str, Any]]:
    return sorted(t.to_arrow().to_pylist(), key=lambda r: (r["id"], r["date"], r["x"]))


def _last(t: Table) -> dict[str, Any]:
    h = t.history(1)[0]
    return {k: h.get(k) for k in ("operation", "operationParameters", "operationMetrics", "isBlindAppend")}


# Spark tasks write their own files (eventlog writes one set per operation), so once a
# rewrite has run the two tables hold the same rows in different files; these metrics then
# legitimately differ.
_LAYOUT_METRICS = ("numRemovedFiles", "numCopiedRows", "numTargetFilesRemoved", "numAddedFiles")


def _same(plain: Table, spark_side: Table, *, params: bool = True, same_layout: bool = True) -> None:
    """Same rows, same last commit (operation, parameters, metrics)."""
    assert _rows(spark_side) == _rows(plain)
    a, b = _last(plain), _last(spark_side)
    if not params:
        a.pop("operationParameters")
        b.pop("operationParameters")
    if not same_layout:
        for m in _LAYOUT_METRICS:
            a["operationMetrics"].pop(m, None)
            b["operationMetrics"].pop(m, None)
    assert b == a


def _unreferenced(t: Table) -> set[str]:
    """Data/DV files on disk no committed version ever referenced, plus staging leftovers."""
    root = Path(t.uri)
    on_disk = {
        str(p.relative_to(root))
        for p in root.rglob("*")
        if p.is_file()
        and p.suffix in (".parquet", ".bin")
        and not p.relative_to(root).parts[0].startswith("_")
    }
    ever = set()
    for c in t.commits_between(0, t.version):
        for a in c.adds:
            ever.add(a.path)
            if a.deletion_vector is not None and a.deletion_vector.storage_type == "u":
                ever.add(dv_relative_path(a.deletion_vector))
    staging = root / "_eventlog" / "spark-staging"
    leftovers = {str(p) for p in staging.rglob("*")} if staging.exists() else set()
    return (on_disk - ever) | leftovers


# --------------------------------------------------------------------------- DELETE / UPDATE


def test_delete_matches_plain(spark: Any, twins: Any) -> None:
    from pyspark.sql import functions as F

    plain, other = twins()
    st = EventlogTable.forPath(spark, other.uri)
    # Partition-only: whole files removed without reading them (no Spark job at all).
    jobs = len(spark.sparkContext.statusTracker().getJobIdsForGroup())
    plain.delete("date = '2024-01-02'")
    st.delete("date = '2024-01-02'")
    _same(plain, other)
    assert len(spark.sparkContext.statusTracker().getJobIdsForGroup()) == jobs
    assert _last(other)["operationMetrics"] == {
        "numRemovedFiles": "1",
        "numDeletedRows": "10",
        "numCopiedRows": "0",
    }
    # Data predicate: rows evaluated by Spark, survivors rewritten.
    plain.delete("x % 3 = 0 AND id < 22")
    st.delete("x % 3 = 0 AND id < 22")
    _same(plain, other)
    assert len(spark.sparkContext.statusTracker().getJobIdsForGroup()) > jobs
    # A Column condition: same rows and metrics; the read predicate comes from its SQL.
    plain, other = twins()
    plain.delete("id > 22")
    EventlogTable.forPath(spark, other.uri).delete(F.col("id") > 22)
    _same(plain, other, params=False)
    assert other.history(1)[0]["operationParameters"]["predicate"] == '["(id > CAST(22 AS BIGINT))"]'
    assert _unreferenced(other) == set()


def test_update_matches_plain(spark: Any, twins: Any) -> None:
    from pyspark.sql import functions as F

    plain, other = twins()
    st = EventlogTable.forPath(spark, other.uri)
    plain.update("date = '2024-01-01' AND x > 5", set={"x": "x * 10", "y": "y + 0.5"})
    st.update("date = '2024-01-01' AND x > 5", set={"x": "x * 10", "Y": "y + 0.5"})
    _same(plain, other)
    plain.update(set={"x": "x + 1"})
    st.update(set={"x": F.col("x") + 1})
    _same(plain, other, same_layout=False)
    with pytest.raises(InvalidInputError):
        st.update("x > 1", set={})
    assert other.version == plain.version


# --------------------------------------------------------------------------- MERGE


def _merge_source() -> list[tuple[Any, ...]]:
    return [
        (1, "2024-01-01", -1, 0.0),  # matched, deleted (s.x < 0)
        (2, "2024-01-01", 200, 2.5),  # matched, updated
        (12, "2024-01-02", 1200, 12.5),  # matched, updated
        (21, "2024-01-01", 2100, 21.5),  # matched (second file), updated
        (100, "2024-01-03", 5, 100.0),  # inserted
        (101, "2024-01-02", -5, 101.0),  # not inserted (clause condition)
    ]


def test_merge_matches_plain(spark: Any, twins: Any) -> None:
    plain, other = twins()
    data = _merge_source()
    arrow = pa.Table.from_pylist([dict(zip(SCHEMA.names, r, strict=True)) for r in data], schema=SCHEMA)
    on = "t.id = s.id AND t.date = s.date"
    (
        plain.merge(arrow, on, source_alias="s", target_alias="t")
        .when_matched_delete("s.x < 0")
        .when_matched_update(set={"x": "s.x", "y": "t.y + s.y"})
        .when_not_matched_insert_all("s.x > 0")
        .execute()
    )
    src = spark.createDataFrame(data, SOURCE_DDL).alias("s")
    result = (
        EventlogTable.forPath(spark, other.uri)
        .alias("t")
        .merge(src, on)
        .whenMatchedDelete("s.x < 0")
        .whenMatchedUpdate(set={"x": "s.x", "y": "t.y + s.y"})
        .whenNotMatchedInsertAll("s.x > 0")
        .execute()
    )
    assert result.version == other.version == plain.version
    _same(plain, other)
    assert _last(other)["operationMetrics"] == {
        "numTargetFilesRemoved": "3", "numTargetRowsUpdated": "3", "numTargetRowsDeleted": "1",
        "numTargetRowsInserted": "1", "numSourceRows": "6",
        "numTargetRowsNotMatchedBySourceUpdated": "0", "numTargetRowsNotMatchedBySourceDeleted": "0",
    }  # fmt: skip
    assert _unreferenced(other) == set()


def test_merge_cardinality_violation_commits_nothing(spark: Any, twins: Any) -> None:
    _, other = twins()
    before = other.version
    src = spark.createDataFrame([(3, "2024-01-01", 1, 1.0), (3, "2024-01-01", 2, 2.0)], SOURCE_DDL).alias("s")
    builder = EventlogTable.forPath(spark, other.uri).alias("t").merge(src, "t.id = s.id")
    with pytest.raises(MergeCardinalityError):
        builder.whenMatchedUpdateAll().execute()
    assert other.version == before and _unreferenced(other) == set()


def _merge(st: EventlogTable, spark: Any, data: list[tuple[Any, ...]], date: str) -> Any:
    src = spark.createDataFrame(data, SOURCE_DDL).alias("s")
    on = f"t.id = s.id AND t.date = '{date}'"
    return st.alias("t").merge(src, on).whenMatchedUpdateAll().whenNotMatchedInsertAll().plan()


def test_concurrent_merges_disjoint_commit_overlapping_conflict(spark: Any, tmp_path: Path) -> None:
    t = _build(str(tmp_path / "t"), ["date"])
    st = EventlogTable.forPath(spark, t.uri)
    # All three planned (Spark jobs run, files written) before any commits.
    first = _merge(st, spark, [(1, "2024-01-01", 111, 1.0), (50, "2024-01-01", 5, 5.0)], "2024-01-01")
    second = _merge(st, spark, [(11, "2024-01-02", 111, 1.0), (60, "2024-01-02", 6, 6.0)], "2024-01-02")
    third = _merge(st, spark, [(2, "2024-01-01", 222, 2.0)], "2024-01-01")
    assert first.read_version == second.read_version == third.read_version == 3
    assert first.commit().version == 4
    assert second.commit().version == 5  # disjoint partitions: no conflict
    ids = {r["id"]: r["x"] for r in t.to_arrow().to_pylist()}
    assert ids[1] == 111 and ids[11] == 111 and 50 in ids and 60 in ids
    # The same partition's files as the first: the third loses, and its files are deleted.
    staged = _unreferenced(t)
    assert staged and all((Path(t.uri) / p).exists() for p in staged)
    with pytest.raises(ConcurrentAppendException):
        third.commit()
    assert t.version == 5 and {r["id"]: r["x"] for r in t.to_arrow().to_pylist()}[2] == 2
    assert _unreferenced(t) == set()


# --------------------------------------------------------------------------- OPTIMIZE


def test_optimize_matches_plain(spark: Any, twins: Any) -> None:
    plain, other = twins()
    for t in (plain, other):
        t.append(rows([30, 31], "2024-01-02"))
    st = EventlogTable.forPath(spark, other.uri)
    plain.optimize()
    st.optimize().executeCompaction()
    _same(plain, other)
    assert _last(other)["operationMetrics"] == {"numRemovedFiles": "4", "numAddedFiles": "2"}
    assert all(not a.data_change for a in other.commits_between(other.version, other.version)[0].adds)
    plain.optimize(zorder_by=["x", "y"], partition_filter="date = '2024-01-01'")
    st.optimize().where("date = '2024-01-01'").executeZOrderBy("x", "y")
    _same(plain, other)
    # Z-order fixes the row order inside the files: the same as eventlog's.
    assert (
        other.to_arrow(filter="date = '2024-01-01'").to_pylist()
        == plain.to_arrow(filter="date = '2024-01-01'").to_pylist()
    )


# --------------------------------------------------------------------------- deletion vectors


def test_dv_table_operations_write_deletion_vectors(spark: Any, twins: Any) -> None:
    plain, other = twins(partition_by=[], properties=DV)
    st = EventlogTable.forPath(spark, other.uri)
    plain.delete("x % 4 = 1")
    st.delete("x % 4 = 1")
    _same(plain, other)
    (commit,) = other.commits_between(other.version, other.version)
    assert commit.adds and all(a.deletion_vector is not None for a in commit.adds)
    assert len(commit.removes) == 3  # the same files, re-added with their DVs
    # A fresh handle (and deltalake's reader contract) sees the rows through the DVs.
    assert sorted(Table.open(other.uri).to_arrow().column("id").to_pylist()) == sorted(
        i for i in range(25) if i % 4 != 1
    )
    plain.update("id >= 20", set={"x": "x + 100"})
    st.update("id >= 20", set={"x": "x + 100"})
    _same(plain, other)
    data = [(2, "2024-01-01", -1, 0.0), (22, "2024-01-01", 7, 7.0), (99, "2024-01-09", 9, 9.0)]
    arrow = pa.Table.from_pylist([dict(zip(SCHEMA.names, r, strict=True)) for r in data], schema=SCHEMA)
    on = "t.id = s.id"
    (
        plain.merge(arrow, on, source_alias="s", target_alias="t")
        .when_matched_delete("s.x < 0")
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute()
    )
    src = spark.createDataFrame(data, SOURCE_DDL).alias("s")
    st.alias("t").merge(src, on).whenMatchedDelete(
        "s.x < 0"
    ).whenMatchedUpdateAll().whenNotMatchedInsertAll().execute()
    _same(plain, other)
    # Compaction on a row-level table records where each source's rows went.
    plain.optimize()
    st.optimize().executeCompaction()
    _same(plain, other)
    (add,) = other.commits_between(other.version, other.version)[0].adds
    assert add.tags is not None and "eventlog.compactedFrom" in add.tags
    assert _unreferenced(other) == set()


# --------------------------------------------------------------------------- vacuum, restore, history


def _backdate(path: Path, hours: float) -> None:
    old = time.time() - hours * 3600
    os.utime(path, (old, old))


def test_vacuum_retention_and_references(spark: Any, tmp_path: Path) -> None:
    t = _build(str(tmp_path / "t"), ["date"])
    st = EventlogTable.forPath(spark, t.uri)
    root = Path(t.uri)
    st.delete("date = '2024-01-02'")  # tombstone (removed just now)
    removed = next(p for p in root.glob("date=2024-01-02/*.parquet"))
    orphan_old = root / "date=2024-01-01" / "part-orphan-old.parquet"
    orphan_new = root / "date=2024-01-01" / "part-orphan-new.parquet"
    orphan_old.write_bytes(b"x")
    orphan_new.write_bytes(b"x")
    for p in root.rglob("*"):
        if p.is_file() and p != orphan_new:
            _backdate(p, 200)
    live = {root / a for a in t.files()}
    # Default retention (168 h): only the old orphan goes; the tombstoned file is kept because
    # its remove (now) is within retention, so a reader of version 3 may still need it.
    assert st.vacuum(dryRun=True) == [str(orphan_old)] and orphan_old.exists()
    assert st.vacuum() == [str(orphan_old)]
    assert not orphan_old.exists() and removed.exists() and orphan_new.exists()
    with pytest.raises(InvalidInputError, match="retention"):
        st.vacuum(0)
    spark.conf.set(RETENTION_CHECK_CONF, "false")
    try:
        deleted = st.vacuum(0)
    finally:
        spark.conf.unset(RETENTION_CHECK_CONF)
    assert sorted(deleted) == sorted([str(removed), str(orphan_new)])
    assert all(p.exists() for p in live) and (root / "_delta_log").exists() and (root / "_eventlog").exists()
    assert sorted(t.to_arrow().column("id").to_pylist()) == [*range(10), *range(20, 25)]


def test_restore_and_history(spark: Any, twins: Any) -> None:
    plain, other = twins()
    st = EventlogTable.forPath(spark, other.uri)
    plain.delete("date = '2024-01-01'")
    st.delete("date = '2024-01-01'")
    plain.restore(2)
    assert st.restoreToVersion(2).version == st.version == 5
    _same(plain, other)
    hist = st.history().collect()
    assert [r.version for r in hist] == [5, 4, 3, 2, 1, 0]
    assert [r.operation for r in hist] == [h["operation"] for h in plain.history()]
    assert hist[0].operationParameters == {"version": "2", "timestamp": "null"}
    assert hist[1].operationMetrics == {"numRemovedFiles": "2", "numDeletedRows": "15", "numCopiedRows": "0"}
    assert [r.version for r in st.history(2).collect()] == [5, 4]


# --------------------------------------------------------------------------- failures


def test_failed_spark_job_commits_nothing_and_cleans_up(spark: Any, tmp_path: Path) -> None:
    from pyspark.sql import functions as F

    t = Table.create(str(tmp_path / "t"), SCHEMA, partition_by=["date"])
    t.append(rows([1, 2], "2024-01-01"))
    t.append(rows([3, 4], "2024-01-02"))  # two files: two tasks, running side by side
    st = EventlogTable.forPath(spark, t.uri)
    before = (t.version, _rows(t))
    staging = str(Path(t.uri) / "_eventlog" / "spark-staging")

    def boom(x: int, date: str) -> int:
        if date == "2024-01-02":
            # Fail only once the other task has written (and reported) its file, so the
            # cleanup has something to delete.
            deadline = time.time() + 60
            while not glob.glob(f"{staging}/*/*.json") and time.time() < deadline:
                time.sleep(0.05)
            raise ValueError("injected task failure")
        return x + 1

    udf = F.udf(boom, "bigint", useArrow=False)
    with pytest.raises(Exception, match="injected task failure"):
        st.update(set={"x": udf(F.col("x"), F.col("date"))})
    assert (t.version, _rows(t)) == before
    assert _unreferenced(t) == set()


def test_to_df_reads_natively_or_through_the_data_source(spark: Any, tmp_path: Path, read_path: str) -> None:
    t = _build(str(tmp_path / "t"), ["date"])
    df = EventlogTable.forPath(spark, t.uri).toDF()
    plan = df._jdf.queryExecution().executedPlan().toString()
    assert ("FileScan parquet" in plan) == (read_path == "native")
    assert sorted(r.id for r in df.collect()) == list(range(25))
