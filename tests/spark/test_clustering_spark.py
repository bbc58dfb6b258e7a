"""Liquid clustering through Spark: ``df.write.option("clusterBy", ...)`` creates a clustered
table, :meth:`EventlogTable.clusterBy` clusters an existing one, and
``optimize().executeCompaction()`` clusters the files in Spark jobs
(:mod:`spark_adapter.ops.optimize_clustered`)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pytest

from eventlog import Table
from eventlog.errors import ClusteringError
from eventlog.ops.optimize_clustered import ZCUBE_ID_TAG, ZCUBE_ZORDER_BY_TAG
from spark_adapter.errors import recover_error
from spark_adapter.ops import optimize_clustered
from spark_adapter.ops.optimize_clustered import curve_values, rank_boundaries
from spark_adapter.table import EventlogTable

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

FMT = "eventlog"
SCHEMA = pa.schema([("id", pa.int64()), ("k", pa.int64()), ("v", pa.string())])


def _batch(seed: int, n: int = 200) -> pa.Table:
    """``n`` rows with ids and keys spread over the whole range (unclustered)."""
    rng = np.random.default_rng(seed)
    ids = rng.permutation(10_000)[:n].astype(np.int64) + seed * 10_000
    keys = rng.integers(0, 1_000, n).astype(np.int64)
    return pa.table({"id": ids, "k": keys, "v": [f"v{i % 7}" for i in ids]}, schema=SCHEMA)


def _unclustered(path: str, appends: int, properties: dict[str, str] | None = None) -> Table:
    """A table clustered by (k, id) with ``appends`` files whose keys span the whole range."""
    t = Table.create(path, SCHEMA, properties=properties, cluster_by=["k", "id"])
    for seed in range(appends):
        t.append(_batch(seed))
    return t


def _rows(t: Table) -> list[dict[str, Any]]:
    return sorted(t.to_arrow().to_pylist(), key=lambda r: r["id"])


def _assert_clustered(t: Table, columns: list[str]) -> set[str]:
    """Every live file is liquid-clustered by ``columns``; the ZCube ids found."""
    files = t.refresh().add_files
    assert files
    assert {f.clustering_provider for f in files} == {"liquid"}
    assert {(f.tags or {}).get(ZCUBE_ZORDER_BY_TAG) for f in files} == {orjson.dumps(columns).decode()}
    return {(f.tags or {})[ZCUBE_ID_TAG] for f in files}


def _refuse(*args: object) -> None:
    raise AssertionError("the other plan was expected")


def test_optimize_through_spark_clusters_one_group_as_the_engine(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(optimize_clustered, "_cluster_shuffled", _refuse)
    t = _unclustered(str(tmp_path / "t"), 4)
    before = _rows(t)
    result = EventlogTable.forPath(spark, t.uri).optimize().executeCompaction()
    assert (result.version, result.operation) == (5, "OPTIMIZE")
    assert result.metrics["numRemovedFiles"] == "4"
    assert len(_assert_clustered(t, ["k", "id"])) == 1  # one ZCube per OPTIMIZE
    assert _rows(t) == before
    info = t.history(1)[0]
    assert info["operationParameters"]["clusterBy"] == '["k","id"]'
    assert info["operationParameters"]["zOrderBy"] == "[]"
    # The same rows as the engine's OPTIMIZE writes them: one Z-ordered file.
    other = _unclustered(str(tmp_path / "e"), 4)
    other.optimize()
    assert t.to_arrow().to_pylist() == other.to_arrow().to_pylist()
    # Nothing unclustered: a second OPTIMIZE rewrites nothing.
    again = EventlogTable.forPath(spark, t.uri).optimize().executeCompaction()
    assert again.metrics["numRemovedFiles"] == "0"


def test_dataframe_write_creates_a_clustered_table_and_spark_clusters_it(spark: Any, tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    for seed in range(3):
        df = spark.createDataFrame(_batch(seed).to_pandas())
        df.write.format(FMT).mode("append").option("clusterBy", "K, `id`").save(uri)  # names as in the schema
    with Table.open(uri) as t:
        assert t.clustering_columns() == ["k", "id"]
        snap = t.refresh()
        assert {"clustering", "domainMetadata"} <= set(snap.protocol.writer_features or ())
        assert orjson.loads(snap.domains["delta.clustering"].configuration)["clusteringColumns"] == [
            ["k"],
            ["id"],
        ]
        assert snap.partition_columns == ()
        assert all(f.clustering_provider is None for f in snap.add_files)  # plain writes do not cluster
        before = _rows(t)
        EventlogTable.forPath(spark, uri).optimize().executeCompaction()
        _assert_clustered(t, ["k", "id"])
        assert _rows(t) == before
        assert sorted(r["id"] for r in spark.read.format(FMT).load(uri).collect()) == [
            r["id"] for r in before
        ]


def test_clusterby_option_must_match_the_tables_clustering(spark: Any, tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    _unclustered(uri, 1).close()
    df = spark.createDataFrame(_batch(7, 5).to_pandas())
    with pytest.raises(Exception) as caught:
        df.write.format(FMT).mode("append").option("clusterBy", "id").save(uri)
    err = recover_error(caught.value)
    assert isinstance(err, ClusteringError)
    assert (err.columns, err.reason) == (["id"], "mismatch")
    assert "['id']" in err.message and "['k', 'id']" in err.message  # both lists named
    # Not clustered, and asked to be: refused the same way.
    plain = str(tmp_path / "plain")
    Table.create(plain, SCHEMA).close()
    with pytest.raises(Exception) as caught:
        df.write.format(FMT).mode("overwrite").option("clusterBy", "k").save(plain)
    err = recover_error(caught.value)
    assert isinstance(err, ClusteringError)
    assert (err.columns, err.reason) == (["k"], "mismatch")
    with Table.open(uri) as t, Table.open(plain) as p:
        assert (t.version, p.version) == (1, 0)  # nothing written
        assert (t.clustering_columns(), p.clustering_columns()) == (["k", "id"], [])
    # The table's own clustering columns (any case): an ordinary append.
    df.write.format(FMT).mode("append").option("clusterBy", "k,ID").save(uri)
    with Table.open(uri) as t:
        assert t.version == 2 and t.to_arrow().num_rows == 205


def test_clusterby_with_partitionby_is_refused(spark: Any, tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    df = spark.createDataFrame(_batch(1, 5).to_pandas())
    with pytest.raises(Exception) as caught:
        df.write.format(FMT).mode("append").option("partitionBy", "v").option("clusterBy", "k").save(uri)
    err = recover_error(caught.value)
    assert isinstance(err, ClusteringError)
    assert (err.columns, err.reason) == (["k"], "partitioned")
    assert not Table.exists(uri)
    with pytest.raises(Exception) as caught:  # the engine's rules: an unknown column, say
        df.write.format(FMT).mode("append").option("clusterBy", "nope").save(uri)
    err = recover_error(caught.value)
    assert isinstance(err, ClusteringError)
    assert (err.columns, err.reason) == (["nope"], "unknown column")
    assert not Table.exists(uri)
    # On an existing partitioned table, too.
    Table.create(uri, SCHEMA, partition_by=["v"]).close()
    with pytest.raises(Exception) as caught:
        df.write.format(FMT).mode("append").option("clusterBy", "k").save(uri)
    err = recover_error(caught.value)
    assert isinstance(err, ClusteringError) and err.reason == "partitioned"
    with Table.open(uri) as t:
        assert t.version == 0
        with pytest.raises(ClusteringError) as refused:
            EventlogTable.forPath(spark, uri).clusterBy("k")
        assert refused.value.reason == "partitioned"
        assert t.refresh().version == 0


def test_cluster_by_later_then_optimize_skips_files_on_the_clustering_column(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(optimize_clustered, "_cluster_one", _refuse)
    path = str(tmp_path / "t")
    # Small target files: the candidates make several output groups (the sampled, shuffled plan).
    t = Table.create(path, SCHEMA, properties={"delta.targetFileSize": "6000"})
    for seed in range(8):
        t.append(_batch(seed))
    before = _rows(t)
    assert len(t.files(filter="k = 500")) == 8  # every file spans every key
    st = EventlogTable.forPath(spark, path)
    result = st.clusterBy(["k"])
    assert (result.version, result.operation) == (9, "CLUSTER BY")
    assert st.clusteringColumns() == ["k"]
    optimized = st.optimize().executeCompaction()
    assert optimized.metrics["numRemovedFiles"] == "8"
    zcubes = _assert_clustered(t, ["k"])
    assert len(zcubes) == 1
    assert _rows(t) == before
    files = t.refresh().add_files
    assert len(files) >= 3
    hits = t.files(filter="k = 500")
    assert 1 <= len(hits) <= 2 < len(files)
    # The files hold disjoint key ranges but at their edges: clustered along k.
    ranges = sorted(
        (orjson.loads(f.stats or "{}")["minValues"]["k"], orjson.loads(f.stats or "{}")["maxValues"]["k"])
        for f in files
    )
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(ranges))
    assert sorted(r["id"] for r in st.toDF().collect()) == [r["id"] for r in before]


def test_zorder_on_a_clustered_table_is_refused_and_changes_nothing(spark: Any, tmp_path: Path) -> None:
    t = _unclustered(str(tmp_path / "t"), 2)
    st = EventlogTable.forPath(spark, t.uri)
    with pytest.raises(ClusteringError) as caught:
        st.optimize().executeZOrderBy("k")
    assert (caught.value.columns, caught.value.reason) == (["k", "id"], "zorder")
    assert t.refresh().version == 2
    assert all(f.clustering_provider is None for f in t.refresh().add_files)
    st.clusterBy()  # CLUSTER BY NONE: Z-order is allowed again, compaction is bin packing
    assert st.clusteringColumns() == []
    result = st.optimize().executeZOrderBy(["k"])
    assert result.operation == "OPTIMIZE" and t.history(1)[0]["operationParameters"]["zOrderBy"] == '["k"]'
    assert all(f.clustering_provider is None for f in t.refresh().add_files)


def test_curve_values_order_rows_by_sampled_ranks() -> None:
    rows = pa.table({"s": ["b", None, "a", "c", "a"], "n": pa.array([3.0, 1.0, None, 2.0, 0.5])})
    bounds = {c: rank_boundaries(rows.column(c), 3) for c in ("s", "n")}
    assert bounds["s"].to_pylist() == ["a", "b", "c"]
    assert bounds["n"].to_pylist() == [0.5, 2.0, 3.0]
    # ranks: s -> [2, 3 (null), 1, 3, 1]; n -> [3, 1, 3 (null), 2, 1]; bit 0 of s, bit 0 of n, ...
    z = curve_values(rows, ["s", "n"], bounds, 2)
    assert z.tolist() == [0b1110, 0b0111, 0b1011, 0b1101, 0b0011]
    one = {"s": rank_boundaries(pa.chunked_array([["x", "x"]]), 3)}
    assert one["s"].to_pylist() == ["x"]
    assert curve_values(pa.table({"s": ["w", "x", "y"]}), ["s"], one, 1).tolist() == [0, 1, 1]


def test_shuffled_clustering_of_a_column_mapped_table_with_deletion_vectors(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(optimize_clustered, "_cluster_one", _refuse)
    props = {
        "delta.columnMapping.mode": "name",
        "delta.enableDeletionVectors": "true",
        "delta.targetFileSize": "6000",
    }
    t = _unclustered(str(tmp_path / "t"), 6, props)
    st = EventlogTable.forPath(spark, t.uri)
    st.delete("k < 100")  # deletion vectors on every file
    assert any(f.deletion_vector is not None for f in t.refresh().add_files)
    st.renameColumn("k", "key")  # clustering follows the column: physical names in the domain
    assert st.clusteringColumns() == ["key", "id"]
    before = _rows(t)
    result = st.optimize().executeCompaction()
    assert result.metrics["numRemovedFiles"] == "6"
    _assert_clustered(t, ["key", "id"])
    files = t.refresh().add_files
    assert len(files) >= 2 and all(f.deletion_vector is None for f in files)
    assert _rows(t) == before and min(r["key"] for r in before) >= 100
    assert sorted(r["id"] for r in st.toDF().collect()) == [r["id"] for r in before]


def _row_ids(t: Table) -> dict[int, tuple[int, int]]:
    rows = t.to_arrow(row_ids=True)
    ids = zip(rows.column("_row_id").to_pylist(), rows.column("_row_commit_version").to_pylist(), strict=True)
    return dict(zip(rows.column("id").to_pylist(), ids, strict=True))


@pytest.mark.parametrize("plan", ["one group", "shuffled", "bin packing"])
def test_spark_optimize_keeps_stable_row_ids(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, plan: str
) -> None:
    props = {"delta.enableRowTracking": "true", "delta.enableDeletionVectors": "true"}
    if plan == "shuffled":
        props["delta.targetFileSize"] = "6000"
        monkeypatch.setattr(optimize_clustered, "_cluster_one", _refuse)
    else:
        monkeypatch.setattr(optimize_clustered, "_cluster_shuffled", _refuse)
    path = str(tmp_path / "t")
    t = Table.create(path, SCHEMA, properties=props, cluster_by=None if plan == "bin packing" else ["k"])
    for seed in range(4):
        t.append(_batch(seed, 100))
    st = EventlogTable.forPath(spark, path)
    st.delete("k < 50")  # deletion vectors: the rewrite reads live rows at their positions
    before = _row_ids(t)
    assert len(set(before.values())) == len(before) > 0
    result = st.optimize().executeCompaction()
    assert result.metrics["numRemovedFiles"] == "4"
    if plan != "bin packing":
        _assert_clustered(t, ["k"])
    assert _row_ids(t) == before
