"""Liquid clustering: ``Table.create(..., cluster_by=...)`` and ``Table.cluster_by`` write
the ``delta.clustering`` domain and the ``clustering`` + ``domainMetadata`` features as Delta
Spark does; bad clustering columns are refused with ClusteringError and nothing committed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pytest

from eventlog import ClusteringError, Table
from eventlog.files.column_mapping import physical_name
from eventlog.snapshot.protocol import features_of

SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string()), ("tags", pa.list_(pa.string()))])


def _domain(t: Table) -> dict[str, object]:
    return dict(orjson.loads(t.refresh().domains["delta.clustering"].configuration))


def test_create_clustered_writes_domain_and_features(tmp_path: Path) -> None:
    with Table.create(str(tmp_path / "t"), SCHEMA, cluster_by=["id", "v"]) as t:
        snapshot = t.refresh()
        assert snapshot.version == 0
        assert {"clustering", "domainMetadata"} <= features_of(snapshot.protocol)
        assert snapshot.protocol.min_writer_version == 7
        assert _domain(t) == {"clusteringColumns": [["id"], ["v"]], "domainName": "delta.clustering"}
        assert t.clustering_columns() == ["id", "v"]
        assert not any(k.startswith("delta.feature") for k in snapshot.metadata.configuration)
        t.append(pa.table({"id": [1], "v": ["a"], "tags": [["x"]]}, schema=SCHEMA))
        assert t.version == 1 and t.clustering_columns() == ["id", "v"]


def test_cluster_by_physical_names_under_column_mapping(tmp_path: Path) -> None:
    props = {"delta.columnMapping.mode": "name"}
    with Table.create(str(tmp_path / "t"), SCHEMA, properties=props, cluster_by=["v"]) as t:
        physical = physical_name(t.refresh().schema.field("v"))
        assert physical != "v"
        assert _domain(t)["clusteringColumns"] == [[physical]]
        assert t.clustering_columns() == ["v"]


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"cluster_by": ["id"], "partition_by": ["v"]}, "partitioned"),
        ({"cluster_by": ["nope"]}, "unknown column"),
        ({"cluster_by": ["tags"]}, "type"),
        ({"cluster_by": ["id", "id"]}, "duplicate"),
    ],
)
def test_create_refuses_bad_clustering(tmp_path: Path, kwargs: dict[str, list[str]], reason: str) -> None:
    path = tmp_path / "t"
    with pytest.raises(ClusteringError) as info:
        Table.create(str(path), SCHEMA, **kwargs)  # type: ignore[arg-type]
    assert info.value.reason == reason
    assert not list((path / "_delta_log").glob("*.json")) if path.exists() else True


def test_cluster_by_later_changes_and_removes_columns(tmp_path: Path) -> None:
    with Table.create(str(tmp_path / "t"), SCHEMA) as t:
        assert t.clustering_columns() == []
        assert "clustering" not in features_of(t.refresh().protocol)
        t.cluster_by(["v"])
        assert t.version == 1 and t.clustering_columns() == ["v"]
        assert {"clustering", "domainMetadata"} <= features_of(t.refresh().protocol)
        t.cluster_by(["id"])
        assert t.clustering_columns() == ["id"]
        t.cluster_by(None)
        assert t.version == 3 and t.clustering_columns() == []
        assert _domain(t)["clusteringColumns"] == []
        assert "clustering" in features_of(t.refresh().protocol)


def test_cluster_by_refuses_partitioned_table(tmp_path: Path) -> None:
    with Table.create(str(tmp_path / "t"), SCHEMA, partition_by=["v"]) as t:
        with pytest.raises(ClusteringError) as info:
            t.cluster_by(["id"])
        assert info.value.reason == "partitioned" and t.refresh().version == 0


# --------------------------------------------------------------------------- OPTIMIZE

IDS = pa.schema([("id", pa.int64()), ("v", pa.string())])


def _append_shuffled(t: Table, batches: int, per: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(batches):
        ids = rng.integers(0, 100_000, per)
        t.append(pa.table({"id": ids, "v": [f"v{i}" for i in ids]}, schema=IDS))


def test_optimize_clusters_files_and_a_point_query_reads_few(tmp_path: Path) -> None:
    props = {"delta.targetFileSize": "30000"}  # the files OPTIMIZE writes: several
    with Table.create(str(tmp_path / "t"), IDS, properties=props, cluster_by=["id"]) as t:
        _append_shuffled(t, 8, 2_000, seed=1)
        before = t.to_arrow().sort_by("id")
        probe = before.column("id")[7_000].as_py()
        assert len(t.files(filter=f"id = {probe}")) >= 6  # every shuffled file spans the range
        result = t.optimize()
        assert result.operation == "OPTIMIZE" and result.metrics["numRemovedFiles"] == "8"
        files = t.refresh().add_files
        assert len(files) >= 3 and all(f.clustering_provider == "liquid" for f in files), len(files)
        assert len(t.files(filter=f"id = {probe}")) <= 2
        assert t.to_arrow().sort_by("id").equals(before)


def test_optimize_is_incremental(tmp_path: Path) -> None:
    with Table.create(str(tmp_path / "t"), IDS, cluster_by=["id"]) as t:
        _append_shuffled(t, 4, 5_000, seed=2)
        t.optimize(target_size=40_000)
        clustered = {f.path for f in t.refresh().add_files}
        nothing = t.optimize(target_size=40_000)
        assert nothing.metrics["numRemovedFiles"] == "0"
        assert {f.path for f in t.refresh().add_files} == clustered
        _append_shuffled(t, 1, 100, seed=3)
        big = {f.path for f in t.refresh().add_files if f.clustering_provider and f.size >= 40_000}
        assert big
        again = t.optimize(target_size=40_000)
        after = {f.path: f for f in t.refresh().add_files}
        assert big <= set(after)  # clustered files at the target size stay
        assert int(again.metrics["numRemovedFiles"]) >= 1
        assert all(f.clustering_provider == "liquid" for f in after.values())
        assert t.to_arrow().num_rows == 20_100


def test_optimize_zorder_on_clustered_table_is_refused(tmp_path: Path) -> None:
    with Table.create(str(tmp_path / "t"), IDS, cluster_by=["id"]) as t:
        _append_shuffled(t, 2, 10, seed=4)
        with pytest.raises(ClusteringError) as info:
            t.optimize(zorder_by=["v"])
        assert info.value.reason == "zorder" and t.refresh().version == 2


def test_optimize_unclustered_table_still_bin_packs_untagged(tmp_path: Path) -> None:
    with Table.create(str(tmp_path / "t"), IDS) as t:
        _append_shuffled(t, 3, 10, seed=5)
        t.optimize()
        files = t.refresh().add_files
        assert len(files) == 1 and files[0].clustering_provider is None


def test_drop_clustering_column_is_refused(tmp_path: Path) -> None:
    props = {"delta.columnMapping.mode": "name"}
    with Table.create(str(tmp_path / "t"), SCHEMA, properties=props, cluster_by=["v"]) as t:
        with pytest.raises(ClusteringError) as info:
            t.drop_columns(["v"])
        assert info.value.reason == "drop clustering column" and t.refresh().version == 0
        t.drop_columns(["tags"])  # other columns still go
        assert t.refresh().schema.names == ["id", "v"] and t.clustering_columns() == ["v"]


@pytest.mark.parametrize(
    ("props", "refused"),
    [
        ({}, True),
        ({"delta.dataSkippingNumIndexedCols": "33"}, False),
    ],
)
def test_clustering_column_needs_statistics(tmp_path: Path, props: dict[str, str], refused: bool) -> None:
    wide = pa.schema([*(pa.field(f"c{i}", pa.int32()) for i in range(32)), pa.field("late", pa.int64())])
    path = str(tmp_path / "t")
    if refused:
        with pytest.raises(ClusteringError) as info:
            Table.create(path, wide, properties=props, cluster_by=["late"])
        assert info.value.reason == "no statistics"
        return
    with Table.create(path, wide, properties=props, cluster_by=["late"]) as t:
        assert t.clustering_columns() == ["late"]


def test_clustering_provider_survives_a_checkpoint(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    with Table.create(path, IDS, cluster_by=["id"]) as t:
        _append_shuffled(t, 2, 50, seed=6)
        t.optimize()
        t.checkpoint()
    with Table.open(path) as t:
        files = t.refresh().add_files
        assert files and {f.clustering_provider for f in files} == {"liquid"}
        assert t.clustering_columns() == ["id"]
